//! The front's TCP server: one task per connection, one request answered at a time per
//! connection, until the shutdown channel says stop.
//!
//! A connection reads a header, checks its length against the limit before reading the body
//! (so a client cannot make the front hold more than it says it will accept, and the buffer
//! grows only as bytes arrive), decodes the message, dispatches it, and writes the reply.
//! Drivers pipeline only with `moreToCome` (a request that gets no reply, which is run and
//! left unanswered) and exhaust (several replies to one request, which the front never sends:
//! `exhaustAllowed` permits but does not require it). A malformed message, an unknown opcode
//! or one the front does not serve closes that connection, logged at warn with the peer's
//! address and the reason; no other connection notices. Nothing read from the network reaches
//! a panic: every length is checked by the codec, and a task that panicked anyway is counted
//! and logged, never taking the listener with it. With TLS (`Settings::tls`), a connection
//! begins with the TLS handshake, which has ten seconds to finish; then it is served the same
//! way over the TLS stream.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::commands::{Connection, Context, Dispatch};
use super::engine::Engine;
use super::error::{CommandError, ErrorCode};
use super::wire::{Header, Limits, Request, RequestForm, WireError, HEADER_LEN};
use super::Settings;

/// The buffer a message body starts with; it grows as bytes arrive, up to the message's
/// checked length.
const INITIAL_BUFFER: usize = 16 * 1024;

/// The server's shared state: its settings, the dispatch table, ids and counters.
pub struct Front {
    settings: Settings,
    dispatch: Dispatch,
    /// What the routed commands run on (`None`: the handshake and diagnostics only).
    engine: Option<Arc<Engine>>,
    next_connection_id: AtomicI64,
    next_request_id: AtomicI32,
    connections: AtomicU64,
    requests: AtomicU64,
    legacy_requests: AtomicU64,
    refused: AtomicU64,
    panics: AtomicU64,
}

/// What a front has done since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connections accepted.
    pub connections: u64,
    /// Requests dispatched (answered, or run without an answer under `moreToCome`).
    pub requests: u64,
    /// Requests that came over the legacy `OP_QUERY` (the first handshake of drivers that
    /// still open with it).
    pub legacy_requests: u64,
    /// Connections closed because of a malformed or refused message, or a failed TLS
    /// handshake.
    pub refused: u64,
    /// Connection tasks that panicked. A panic is a bug; this stays 0.
    pub panics: u64,
}

impl Front {
    /// A front with the standard dispatch table.
    pub fn new(settings: Settings) -> Front {
        Front::with_dispatch(settings, Dispatch::standard())
    }

    /// A front that routes: the standard table over `engine`.
    pub fn with_engine(settings: Settings, engine: Arc<Engine>) -> Front {
        Front {
            engine: Some(engine),
            ..Front::new(settings)
        }
    }

    pub fn with_dispatch(settings: Settings, dispatch: Dispatch) -> Front {
        Front {
            settings,
            dispatch,
            engine: None,
            next_connection_id: AtomicI64::new(1),
            next_request_id: AtomicI32::new(1),
            connections: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            legacy_requests: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            panics: AtomicU64::new(0),
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn stats(&self) -> Stats {
        Stats {
            connections: self.connections.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            legacy_requests: self.legacy_requests.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            panics: self.panics.load(Ordering::Relaxed),
        }
    }

    fn request_id(&self) -> i32 {
        self.next_request_id.fetch_add(1, Ordering::Relaxed)
    }
}

/// Serves `listener` until `shutdown` turns true (or its sender is dropped): then it accepts
/// no more connections, lets each connection finish the request it is answering, and returns
/// once every connection has closed.
pub async fn serve(
    listener: TcpListener,
    front: Arc<Front>,
    mut shutdown: watch::Receiver<bool>,
) -> io::Result<()> {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = stopped(&mut shutdown) => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    front.connections.fetch_add(1, Ordering::Relaxed);
                    let front = Arc::clone(&front);
                    let shutdown = shutdown.clone();
                    connections.spawn(async move {
                        serve_connection(front, stream, peer, shutdown).await;
                    });
                }
                Err(error) => {
                    // Out of file descriptors, or a connection reset before it was accepted:
                    // the listener itself is fine, so it keeps going after a pause that keeps
                    // a persistent error from spinning.
                    tracing::warn!(%error, "front: accepting a connection failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
            Some(ended) = connections.join_next(), if !connections.is_empty() => {
                note_ended(&front, ended);
            }
        }
    }
    drop(listener);
    tracing::info!(
        connections = connections.len(),
        "front: stopping, waiting for open connections to finish their requests"
    );
    while let Some(ended) = connections.join_next().await {
        note_ended(&front, ended);
    }
    Ok(())
}

/// Resolves once the front is asked to stop, or once no one can ask any more.
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

fn note_ended(front: &Front, ended: Result<(), tokio::task::JoinError>) {
    if let Err(error) = ended {
        if error.is_panic() {
            front.panics.fetch_add(1, Ordering::Relaxed);
            tracing::error!(%error, "front: a connection task panicked");
        }
    }
}

/// Why a connection stopped reading.
#[derive(Debug)]
enum ReadError {
    /// The message is malformed or of a kind the front does not serve.
    Wire(WireError),
    /// The peer closed the connection inside a message.
    Cut {
        expected: usize,
        got: usize,
    },
    Io(io::Error),
}

impl From<io::Error> for ReadError {
    fn from(error: io::Error) -> Self {
        ReadError::Io(error)
    }
}

async fn serve_connection(
    front: Arc<Front>,
    stream: TcpStream,
    peer: SocketAddr,
    mut shutdown: watch::Receiver<bool>,
) {
    // Requests and replies are small and strictly alternate: Nagle's delay would only add
    // latency to each reply.
    let _ = stream.set_nodelay(true);
    let local = stream
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let connection = Connection {
        id: front.next_connection_id.fetch_add(1, Ordering::Relaxed),
        peer,
        local,
        client_metadata: None,
        authentication: Default::default(),
    };
    let id = connection.id;
    tracing::debug!(%peer, connection = id, "front: connection accepted");
    match &front.settings.tls {
        None => serve_messages(&front, stream, connection, &mut shutdown).await,
        Some(tls) => {
            if let Some(stream) =
                tls_handshake(&front, tls, stream, &connection, &mut shutdown).await
            {
                serve_messages(&front, stream, connection, &mut shutdown).await;
            }
        }
    }
    tracing::debug!(%peer, connection = id, "front: connection closed");
}

/// How long a client has to finish its TLS handshake once connected.
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The server's side of the connection's TLS handshake; `None` (logged) when it fails, times
/// out or the front stops meanwhile. A client that does not speak TLS fails here.
async fn tls_handshake(
    front: &Front,
    tls: &super::tls::Tls,
    stream: TcpStream,
    connection: &Connection,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let handshake = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tls.accept(stream));
    let outcome = tokio::select! {
        biased;
        () = stopped(shutdown) => return None,
        outcome = handshake => outcome,
    };
    let (peer, id) = (connection.peer, connection.id);
    match outcome {
        Ok(Ok(stream)) => Some(stream),
        // Closed before a word (a load balancer's TCP check): nothing to report.
        Ok(Err(error)) if error.kind() == io::ErrorKind::UnexpectedEof => {
            tracing::debug!(%peer, connection = id, "front: closed before its TLS handshake");
            None
        }
        Ok(Err(error)) => {
            front.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, connection = id, %error,
                "front: closing the connection: its TLS handshake failed (a client without TLS?)");
            None
        }
        Err(_) => {
            front.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, connection = id, timeout = ?TLS_HANDSHAKE_TIMEOUT,
                "front: closing the connection: its TLS handshake did not finish in time");
            None
        }
    }
}

/// Reads, answers and writes the connection's messages until it closes, a message is refused,
/// or the front stops.
async fn serve_messages<S>(
    front: &Front,
    mut stream: S,
    mut connection: Connection,
    shutdown: &mut watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let peer = connection.peer;
    let limits = front.settings.limits;
    loop {
        // Between messages, and while one arrives, a shutdown closes the connection: no
        // request of it is being answered.
        let bytes = tokio::select! {
            biased;
            () = stopped(shutdown) => break,
            read = read_message(&mut stream, &limits) => read,
        };
        let bytes = match bytes {
            Ok(Some(bytes)) => bytes,
            Ok(None) => break,
            Err(ReadError::Wire(reason)) => {
                refuse(front, &connection, &reason);
                break;
            }
            Err(ReadError::Cut { expected, got }) => {
                front.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    %peer,
                    connection = connection.id,
                    expected,
                    got,
                    "front: closing the connection: it ended inside a message"
                );
                break;
            }
            Err(ReadError::Io(error)) => {
                tracing::debug!(%peer, connection = connection.id, %error, "front: read failed");
                break;
            }
        };
        let request = match Request::decode(&bytes, &limits) {
            Ok(request) => request,
            Err(reason) => {
                refuse(front, &connection, &reason);
                break;
            }
        };
        drop(bytes);
        let mut context = Context {
            settings: &front.settings,
            connection: &mut connection,
            engine: front.engine.as_deref(),
        };
        let reply = front.dispatch.answer(&mut context, &request).await;
        front.requests.fetch_add(1, Ordering::Relaxed);
        if matches!(request.form, RequestForm::Query { .. }) {
            front.legacy_requests.fetch_add(1, Ordering::Relaxed);
        }
        if !request.expects_reply() {
            continue;
        }
        let Some(frame) = reply_frame(front, &request, reply) else {
            tracing::error!(%peer, connection = connection.id, "front: no reply could be encoded");
            break;
        };
        // A TLS stream holds what it is given until flushed; a TCP stream's flush does nothing.
        let written = match stream.write_all(&frame).await {
            Ok(()) => stream.flush().await,
            Err(error) => Err(error),
        };
        if let Err(error) = written {
            tracing::debug!(%peer, connection = connection.id, %error, "front: write failed");
            break;
        }
    }
}

fn refuse(front: &Front, connection: &Connection, reason: &WireError) {
    front.refused.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(
        peer = %connection.peer,
        connection = connection.id,
        %reason,
        "front: closing the connection: malformed or refused message"
    );
}

/// The frame of a reply; a reply that cannot be encoded, or is larger than a message may be,
/// is replaced by an error that says so.
fn reply_frame(front: &Front, request: &Request, reply: bson::Document) -> Option<Vec<u8>> {
    let max = front.settings.limits.max_message_size;
    let error = match request.reply(front.request_id(), reply) {
        Ok(frame) if frame.len() <= max => return Some(frame),
        Ok(frame) => CommandError::new(
            ErrorCode::InternalError,
            format!(
                "the reply of {} bytes exceeds the largest message ({max} bytes)",
                frame.len()
            ),
        ),
        Err(error) => CommandError::new(ErrorCode::InternalError, error.to_string()),
    };
    request.reply(front.request_id(), error.to_document()).ok()
}

/// Reads one whole message: `None` when the peer closed the connection between messages.
/// The header's length is checked before the body is read.
async fn read_message(
    stream: &mut (impl AsyncRead + Unpin),
    limits: &Limits,
) -> Result<Option<Vec<u8>>, ReadError> {
    let mut header = [0u8; HEADER_LEN];
    let mut filled = 0;
    while filled < HEADER_LEN {
        let n = stream.read(&mut header[filled..]).await?;
        if n == 0 {
            if filled == 0 {
                return Ok(None);
            }
            return Err(ReadError::Cut {
                expected: HEADER_LEN,
                got: filled,
            });
        }
        filled += n;
    }
    let parsed = Header::parse(&header, limits).map_err(ReadError::Wire)?;
    let mut bytes = Vec::with_capacity(parsed.message_length.min(INITIAL_BUFFER));
    bytes.extend_from_slice(&header);
    let body = (parsed.message_length - HEADER_LEN) as u64;
    stream.take(body).read_to_end(&mut bytes).await?;
    if bytes.len() < parsed.message_length {
        return Err(ReadError::Cut {
            expected: parsed.message_length,
            got: bytes.len(),
        });
    }
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn ping(request_id: i32) -> Vec<u8> {
        crate::front::wire::Message {
            request_id,
            response_to: 0,
            op: crate::front::wire::Op::Msg(crate::front::wire::OpMsg {
                flags: crate::front::wire::MsgFlags(0),
                sections: vec![crate::front::wire::Section::Body(
                    doc! {"ping": 1, "$db": "admin"},
                )],
            }),
        }
        .encode()
        .unwrap()
    }

    #[tokio::test]
    async fn a_message_is_read_whole_and_a_close_between_messages_is_no_error() {
        let message = ping(1);
        let mut input: &[u8] = &[message.clone(), message.clone()].concat();
        let limits = Limits::default();
        assert_eq!(
            read_message(&mut input, &limits).await.unwrap(),
            Some(message.clone())
        );
        assert_eq!(
            read_message(&mut input, &limits).await.unwrap(),
            Some(message)
        );
        assert_eq!(read_message(&mut input, &limits).await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_message_cut_short_or_too_long_is_refused() {
        let message = ping(1);
        let limits = Limits::default();
        let mut cut: &[u8] = &message[..message.len() - 1];
        assert!(matches!(
            read_message(&mut cut, &limits).await,
            Err(ReadError::Cut { expected, got }) if expected == message.len() && got == message.len() - 1
        ));
        let mut header_only: &[u8] = &message[..7];
        assert!(matches!(
            read_message(&mut header_only, &limits).await,
            Err(ReadError::Cut {
                expected: 16,
                got: 7
            })
        ));
        // The limit is checked on the header: the body is never read.
        let small = Limits {
            max_message_size: message.len() - 1,
        };
        let mut input: &[u8] = &message;
        assert!(matches!(
            read_message(&mut input, &small).await,
            Err(ReadError::Wire(WireError::TooLong { .. }))
        ));
        assert_eq!(input.len(), message.len() - HEADER_LEN);
    }
}
