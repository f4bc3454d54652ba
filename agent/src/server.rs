//! The accept loop: each connection admitted (see `connections`), its TLS handshake
//! bounded, then served by hyper over HTTP/1.1 or HTTP/2 until it ends, its stranger's
//! deadline passes, it is evicted, or the agent shuts down.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tower::Layer;

use crate::connections::{Admission, CloseReason, Limited};
use crate::ratelimit::RateLimit;
use crate::tls::{PeerCertificate, peer_identity};

/// How long a connection told to go (a stranger past its deadline, an evicted one, all
/// at shutdown after the grace) may take to finish the answers in flight before it is
/// cut: an answer to a stranger is small, so only a client that stopped reading needs it.
const STRANGER_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Everything a connection's task needs, shared by all.
struct Serving {
    admission: Admission,
    tls: TlsAcceptor,
    app: Router,
    http: auto::Builder<TokioExecutor>,
    failure_log: RateLimit,
}

/// Serves `app` on `listener` until `shutdown` completes, then lets the connections
/// finish their requests for up to `grace`.
pub(crate) async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    admission: Admission,
    app: Router,
    header_read_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) {
    let mut http = auto::Builder::new(TokioExecutor::new());
    // hyper applies the header-read timeout only with a timer; it covers a request whose
    // headers trickle in and the wait for the next request on a kept-alive connection.
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    let serving = Arc::new(Serving {
        admission,
        tls: TlsAcceptor::from(tls),
        app,
        http,
        failure_log: RateLimit::new(20, "failed TLS handshakes"),
    });
    let (stop, stopping) = watch::channel(false);
    let accept_errors = RateLimit::new(1, "failed accepts");
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                tokio::spawn(serve_connection(
                    serving.clone(),
                    stream,
                    peer,
                    stopping.clone(),
                ));
            }
            Err(error) => {
                // Out of descriptors, most likely: closing connections frees some soon,
                // and retrying at once would only spin.
                if accept_errors.allow() {
                    tracing::warn!(%error, "cannot accept a connection");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    drop(listener);
    tracing::info!(
        grace_seconds = grace.as_secs(),
        "shutting down; finishing in-flight requests"
    );
    let _ = stop.send(true);
    // Every connection's task holds a receiver until it ends.
    drop(stopping);
    if tokio::time::timeout(grace, stop.closed()).await.is_err() {
        tracing::warn!("connections still open after the shutdown grace; closing them");
    }
}

async fn serve_connection(
    serving: Arc<Serving>,
    stream: TcpStream,
    peer: SocketAddr,
    mut stopping: watch::Receiver<bool>,
) {
    // Counted from the first byte: a connection over its source's share is dropped
    // before its handshake costs anything.
    let Some(ticket) = serving.admission.admit(peer.ip()) else {
        return;
    };
    let settings = serving.admission.settings();
    let metrics = serving.admission.metrics();
    let stream = Limited::new(stream, settings.idle_timeout);
    let handshake = tokio::select! {
        handshake = tokio::time::timeout(
            settings.tls_handshake_timeout,
            serving.tls.accept(stream),
        ) => handshake,
        () = ticket.evicted() => return,
    };
    let stream = match handshake {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            metrics.count(CloseReason::handshake_failed);
            if serving.failure_log.allow() {
                tracing::warn!(target: "audit", %peer, %error, "TLS handshake failed");
            }
            return;
        }
        Err(_) => {
            metrics.count(CloseReason::handshake_timeout);
            return;
        }
    };
    let identity = peer_identity(stream.get_ref().1);
    let admitted = match identity {
        Some(_) => ticket.authenticate().is_ok(),
        None => ticket.handshake_done(),
    };
    if !admitted {
        return;
    }
    let service = axum::Extension(ticket.clone())
        .layer(axum::Extension(PeerCertificate(identity)).layer(serving.app.clone()));
    let connection = serving
        .http
        .serve_connection_with_upgrades(TokioIo::new(stream), TowerToHyperService::new(service));
    tokio::pin!(connection);
    let stranger_deadline = tokio::time::sleep(settings.unauthenticated_timeout);
    tokio::pin!(stranger_deadline);
    let mut watch_deadline = !ticket.is_authenticated();
    let mut closing = false;
    let cut = tokio::time::sleep(Duration::MAX);
    tokio::pin!(cut);
    loop {
        tokio::select! {
            _ = connection.as_mut() => return,
            () = &mut stranger_deadline, if watch_deadline => {
                watch_deadline = false;
                if !ticket.is_authenticated() && !closing {
                    metrics.count(CloseReason::unauthenticated_timeout);
                    closing = true;
                    connection.as_mut().graceful_shutdown();
                    cut.as_mut().reset(Instant::now() + STRANGER_CLOSE_GRACE);
                }
            }
            // Counted where it was evicted.
            () = ticket.evicted(), if !closing => {
                closing = true;
                connection.as_mut().graceful_shutdown();
                cut.as_mut().reset(Instant::now() + STRANGER_CLOSE_GRACE);
            }
            () = stopped(&mut stopping), if !closing => {
                closing = true;
                // At shutdown, authenticated requests get the whole grace (the accept
                // loop waits for it); strangers no more than at any other time.
                connection.as_mut().graceful_shutdown();
                if !ticket.is_authenticated() {
                    cut.as_mut().reset(Instant::now() + STRANGER_CLOSE_GRACE);
                }
            }
            () = &mut cut, if closing => return,
        }
    }
}

/// Completes once the agent is shutting down.
async fn stopped(stopping: &mut watch::Receiver<bool>) {
    if stopping.wait_for(|stop| *stop).await.is_err() {
        // The accept loop is gone without a word: nothing more to wait for.
        std::future::pending::<()>().await;
    }
}
