//! What ganesha itself serves, read through its DisplayExport on one D-Bus connection
//! kept open: a dbus-send process per export would cost more than the changes it checks
//! at tens of thousands of exports.

use std::time::{Duration, Instant};

use zbus::zvariant::{Structure, Value};

pub struct ExportManager {
    connection: zbus::blocking::Connection,
}

impl ExportManager {
    pub fn connect(address: &str) -> anyhow::Result<Self> {
        let connection = zbus::blocking::connection::Builder::address(address)?.build()?;
        Ok(Self { connection })
    }

    /// Whether ganesha's DisplayExport of export `id` names `client` among its
    /// clients: the answer holds a string that is it, or it with a prefix length
    /// (ganesha shows an address as `127.0.0.3/32`).
    pub fn admits(&self, id: u16, client: &str) -> anyhow::Result<bool> {
        let reply = self.connection.call_method(
            Some("org.ganesha.nfsd"),
            "/org/ganesha/nfsd/ExportMgr",
            Some("org.ganesha.nfsd.exportmgr"),
            "DisplayExport",
            &(id,),
        )?;
        let body = reply.body();
        let answer: Structure<'_> = body.deserialize()?;
        Ok(answer.fields().iter().any(|field| names(field, client)))
    }

    /// Asks for every export of `ids` until each admits `client`, again for those that
    /// do not yet, for at most `limit`. Returns when the last one did.
    pub fn wait_until_all_admit(
        &self,
        ids: &[u16],
        client: &str,
        limit: Duration,
    ) -> anyhow::Result<Instant> {
        let deadline = Instant::now() + limit;
        let mut pending = ids.to_vec();
        loop {
            let mut still = Vec::new();
            for &id in &pending {
                if !self.admits(id, client)? {
                    still.push(id);
                }
            }
            if still.is_empty() {
                return Ok(Instant::now());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "after {}s, ganesha's DisplayExport does not show {client} for {} of {} exports (first: id {})",
                limit.as_secs(),
                still.len(),
                ids.len(),
                still[0]
            );
            pending = still;
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Whether `value` is, or holds somewhere within it, the string `client`, alone or
/// followed by a prefix length.
fn names(value: &Value<'_>, client: &str) -> bool {
    match value {
        Value::Str(s) => s
            .as_str()
            .strip_prefix(client)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/')),
        Value::Structure(s) => s.fields().iter().any(|field| names(field, client)),
        Value::Array(a) => a.iter().any(|item| names(item, client)),
        Value::Value(inner) => names(inner, client),
        Value::Dict(d) => d
            .iter()
            .any(|(key, item)| names(key, client) || names(item, client)),
        _ => false,
    }
}
