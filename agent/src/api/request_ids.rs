//! The request id a client sends: kept when it is short and plain, replaced otherwise.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use nfsprov_api_types::REQUEST_ID_HEADER;

/// The longest request id kept; a longer one is replaced.
const MAX_REQUEST_ID_BYTES: usize = 128;

/// Whether a client's request id is kept as it is: short, and only characters that
/// cannot disturb a log line or a header (those of object names and timestamps).
fn fit_request_id(id: &[u8]) -> bool {
    !id.is_empty()
        && id.len() <= MAX_REQUEST_ID_BYTES
        && id
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/@+=".contains(b))
}

/// Removes a request id that is not [`fit_request_id`], so the agent makes one of its own;
/// the id used is the one sent back and logged.
pub(super) async fn drop_unfit_request_id(mut request: Request, next: Next) -> Response {
    let headers = request.headers_mut();
    let unfit = headers
        .get_all(REQUEST_ID_HEADER)
        .iter()
        .any(|id| !fit_request_id(id.as_bytes()))
        || headers.get_all(REQUEST_ID_HEADER).iter().count() > 1;
    if unfit {
        headers.remove(REQUEST_ID_HEADER);
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_kept_only_short_and_plain() {
        for kept in [
            "pvc-0d1e-17f3a9c2b4",
            "orphan-check-1a2b",
            "a",
            "ns/claim@x:1+2=3_.",
        ] {
            assert!(fit_request_id(kept.as_bytes()), "{kept}");
        }
        assert!(fit_request_id("r".repeat(MAX_REQUEST_ID_BYTES).as_bytes()));
        for replaced in [
            String::new(),
            "r".repeat(MAX_REQUEST_ID_BYTES + 1),
            "a b".into(),
            "a\"b".into(),
            "a\\nb".into(),
            "é".into(),
            "x\u{1b}[2J".into(),
        ] {
            assert!(!fit_request_id(replaced.as_bytes()), "{replaced:?}");
        }
    }
}
