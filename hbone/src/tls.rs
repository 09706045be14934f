//! TLS 1.3 for HBONE connections, with the records of an established connection opened in
//! place.
//!
//! rustls runs the handshake (its unbuffered API, over the same read buffer the connection
//! keeps afterwards), then hands over the traffic keys through its kernel-connection API,
//! and this module carries the TLS 1.3 record protocol (RFC 8446 section 5) from there:
//!
//! - An application data record is decrypted where the socket read put it, and the reader
//!   copies its plaintext out once. rustls's buffered API copies each record three times on
//!   its way in (the read buffer into its deframer, the plaintext into its queue, the queue
//!   out to the reader), which was a tenth of the HBONE server's CPU in a bulk transfer.
//! - Records are sealed with the provider's own AEAD (`Tls13AeadAlgorithm`), as rustls seals
//!   them, and queued up to [`TLS_WRITE_BUFFER`](crate::TLS_WRITE_BUFFER) bytes for vectored
//!   writes.
//! - rustls keeps what only it should: the key schedule (a KeyUpdate from the peer asks its
//!   [`KernelConnection`] for the next receive key; one of ours, for the next send key) and
//!   session tickets (a client hands each NewSessionTicket to it).
//!
//! The rules enforced on what the peer sends, each a fatal error with the alert RFC 8446
//! names: every record's outer type is application_data with version 0x0303 and at most
//! 2^14 + 256 bytes of ciphertext; it decrypts with the next sequence number; the inner type
//! is application data, an alert (close_notify ends the stream, user_canceled is ignored,
//! anything else ends the connection) or a handshake message, a KeyUpdate or (to a client) a
//! NewSessionTicket, not interleaved with other types and, for a KeyUpdate, ending its
//! record. A stream that ends without close_notify is an `UnexpectedEof` error, never a
//! clean end: a truncated transfer does not look complete.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::BufMut;
use meshkit_identity::{AcceptError, CertSelector, ConnectionInfo, SpiffeId};
use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::crypto::cipher::{
    InboundOpaqueMessage, MessageDecrypter, MessageEncrypter, OutboundChunks, OutboundPlainMessage,
};
use rustls::kernel::KernelConnection;
use rustls::pki_types::ServerName;
use rustls::server::{Acceptor, ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    ConnectionState, EncodeError, InsufficientSizeError, UnbufferedConnectionCommon,
    UnbufferedStatus,
};
use rustls::{
    AlertDescription, ConnectionTrafficSecrets, ContentType, Error as TlsError, HandshakeType,
    InvalidMessage, PeerMisbehaved, ProtocolVersion,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio_util::io::poll_read_buf;

/// The record header: type, legacy version, length.
const HEADER: usize = 5;
/// The most plaintext one record carries (RFC 8446 section 5.1).
const MAX_FRAGMENT: usize = 1 << 14;
/// The most ciphertext one record may carry (RFC 8446 section 5.2).
const MAX_CIPHERTEXT: usize = MAX_FRAGMENT + 256;
/// The largest record on the wire.
const MAX_RECORD: usize = HEADER + MAX_CIPHERTEXT;
/// The outer content type of every protected record.
const APPLICATION_DATA: u8 = 23;
/// The legacy record version every protected record carries.
const RECORD_VERSION: [u8; 2] = [3, 3];
/// The read buffer while handshaking: it starts at this size and grows as messages need.
const HANDSHAKE_BUFFER: usize = 4096;
/// The most the read buffer grows to while handshaking: rustls takes handshake messages of
/// up to 64 KiB, which may span records.
const MAX_HANDSHAKE_BUFFER: usize = 0x1_0000 + 2 * MAX_RECORD;
/// The largest read buffer of an established connection: two full reads and a record, so
/// that the partial record a read leaves at the end is moved to the front at most every
/// other read.
const DATA_BUFFER: usize = 2 * crate::TLS_READ_BUFFER + MAX_RECORD;
/// The read buffer an established connection starts with: room for two records. It doubles
/// each time a read fills what it asked for, up to [`DATA_BUFFER`], so an interactive
/// connection stays small and a new one costs little, while a bulk one grows in three reads.
const FIRST_DATA_BUFFER: usize = 2 * MAX_RECORD;
/// The longest post-handshake message held while its records arrive (a NewSessionTicket
/// or a KeyUpdate; rustls's own limit for handshake messages).
const MAX_POST_HANDSHAKE_MESSAGE: usize = 0xffff;
/// Records without application data accepted in a row (empty ones, tickets, KeyUpdates,
/// user_canceled alerts): each costs a decryption and yields nothing, so a peer that sends
/// only those is stopped.
const MAX_EMPTY_RECORDS: u8 = 32;
/// Records passed to one vectored write.
const MAX_SLICES: usize = 64;

/// Which end of the connection this is; the client takes session tickets, the server may not
/// receive them.
pub(crate) trait Role: Send + Sync + Sized + Unpin + 'static {
    /// Handles a NewSessionTicket message's body.
    fn new_session_ticket(
        kernel: &mut KernelConnection<Self>,
        payload: &[u8],
    ) -> Result<(), TlsError>;
}

impl Role for ClientConnectionData {
    fn new_session_ticket(
        kernel: &mut KernelConnection<Self>,
        payload: &[u8],
    ) -> Result<(), TlsError> {
        kernel.handle_new_session_ticket(payload)
    }
}

impl Role for ServerConnectionData {
    fn new_session_ticket(_: &mut KernelConnection<Self>, _: &[u8]) -> Result<(), TlsError> {
        Err(unexpected_handshake(HandshakeType::NewSessionTicket))
    }
}

/// A TLS 1.3 connection over `IO` after its handshake.
pub(crate) struct TlsStream<IO, R: Role> {
    io: IO,
    kernel: KernelConnection<R>,
    aead: &'static dyn rustls::crypto::cipher::Tls13AeadAlgorithm,
    peer: Option<SpiffeId>,
    rx: Inbound,
    tx: Outbound,
}

/// The client end.
pub(crate) type ClientTls<IO> = TlsStream<IO, ClientConnectionData>;
/// The server end.
pub(crate) type ServerTls<IO> = TlsStream<IO, ServerConnectionData>;

/// The read side: one buffer that socket reads fill, where records are decrypted.
struct Inbound {
    buf: ReadBuffer,
    decrypter: Box<dyn MessageDecrypter>,
    seq: u64,
    /// Unread plaintext of the current record, as positions in `buf`.
    plain: (usize, usize),
    /// Where the current record ends in `buf`: the buffer is consumed up to it once its
    /// plaintext has been read.
    record_end: usize,
    /// What the read buffer may grow to now (see [`FIRST_DATA_BUFFER`]).
    capacity: usize,
    /// A post-handshake handshake message whose records are still arriving.
    handshake: Vec<u8>,
    empty_records: u8,
    /// close_notify received.
    closed: bool,
    /// The first fatal error; every later read reports it again.
    failed: Option<TlsError>,
}

/// The write side: sealed records waiting for the transport.
struct Outbound {
    encrypter: Box<dyn MessageEncrypter>,
    seq: u64,
    /// Records sealed under one key before the next KeyUpdate of ours: the suite's
    /// confidentiality limit.
    limit: u64,
    queue: VecDeque<Vec<u8>>,
    queued: usize,
    /// Bytes of the queue's first record already written.
    front_sent: usize,
    /// The peer asked for a KeyUpdate: ours goes before the next application data.
    key_update_owed: bool,
    close_notify_sent: bool,
    /// A record from the peer was refused: our alert is the last record sealed.
    fatal: bool,
}

/// The read buffer shared by the handshake and the connection after it.
///
/// Its bytes from `start` to its length have been read and not yet taken; its capacity is its
/// size. The room past its length is never zeroed: reads go into it as it is, so a buffer
/// that grows (to the first data buffer when the handshake is over, every connection) costs
/// no memset of the part a read will overwrite anyway.
struct ReadBuffer {
    buf: Vec<u8>,
    start: usize,
}

impl ReadBuffer {
    fn new() -> Self {
        Self {
            buf: Vec::new(),
            start: 0,
        }
    }

    fn data(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..]
    }

    fn discard(&mut self, n: usize) {
        self.start += n;
        debug_assert!(self.start <= self.buf.len());
        if self.start == self.buf.len() {
            self.start = 0;
            self.buf.clear();
        }
    }

    /// Reads from `io` at the end of what is buffered: up to `read` bytes, into a buffer of
    /// `capacity` bytes (grown to it, up to `limit` when what is buffered needs more). `Ok(0)`
    /// is the end of the stream.
    fn poll_fill<IO: AsyncRead + Unpin>(
        &mut self,
        io: &mut IO,
        cx: &mut Context<'_>,
        read: usize,
        capacity: usize,
        limit: usize,
    ) -> Poll<io::Result<usize>> {
        // Room for a whole read at the end, by moving what is kept (at most a partial record
        // once the handshake is done) to the front.
        if self.start > 0 && self.buf.capacity() - self.buf.len() < read {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        if self.buf.capacity() < capacity {
            self.buf.reserve_exact(capacity - self.buf.len());
        }
        if self.buf.len() == self.buf.capacity() {
            if self.buf.capacity() >= limit {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "TLS message larger than the read buffer allows",
                )));
            }
            let grown = (self.buf.capacity() * 2).clamp(HANDSHAKE_BUFFER, limit);
            self.buf.reserve_exact(grown - self.buf.len());
        }
        let room = (self.buf.capacity() - self.buf.len()).min(read);
        poll_read_buf(Pin::new(io), cx, &mut (&mut self.buf).limit(room))
    }
}

// === handshake ===

/// What [`handshake`] does after one step of rustls's unbuffered state machine.
enum Step {
    Continue,
    Read,
    Traffic,
    /// close_notify from the peer before the handshake is over.
    PeerClosed,
    Failed(TlsError),
}

/// An unbuffered rustls connection of either side.
trait Handshaking: Send {
    type Role: Role;
    fn common(&mut self) -> &mut UnbufferedConnectionCommon<Self::Role>;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Role>;
    fn into_kernel(
        self,
    ) -> Result<(rustls::ExtractedSecrets, KernelConnection<Self::Role>), TlsError>;
}

/// The two unbuffered connection types have the same methods but no trait for them.
macro_rules! handshaking {
    ($conn:ty, $role:ty) => {
        impl Handshaking for $conn {
            type Role = $role;
            fn common(&mut self) -> &mut UnbufferedConnectionCommon<Self::Role> {
                self
            }
            fn process<'c, 'i>(
                &'c mut self,
                incoming: &'i mut [u8],
            ) -> UnbufferedStatus<'c, 'i, Self::Role> {
                self.process_tls_records(incoming)
            }
            fn into_kernel(
                self,
            ) -> Result<(rustls::ExtractedSecrets, KernelConnection<Self::Role>), TlsError> {
                self.dangerous_into_kernel_connection()
            }
        }
    };
}

handshaking!(UnbufferedClientConnection, ClientConnectionData);
handshaking!(UnbufferedServerConnection, ServerConnectionData);

/// Connects as a TLS client over `io`.
///
/// The records rustls encodes go to `io` when the handshake has to wait for the server, or is
/// over (see `handshake`). On a failure, the alert rustls produced is written and flushed, and
/// `io` is handed back with the error so that the caller can make sure it leaves.
pub(crate) async fn connect<IO: AsyncRead + AsyncWrite + Unpin>(
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
    io: IO,
) -> Result<ClientTls<IO>, (io::Error, IO)> {
    let mut config = config;
    if !config.enable_secret_extraction {
        // Handing the keys over needs it; the caller's configuration is left as it is.
        Arc::make_mut(&mut config).enable_secret_extraction = true;
    }
    match UnbufferedClientConnection::new(config, name) {
        Ok(conn) => handshake(conn, io, ReadBuffer::new()).await,
        Err(e) => Err((tls_error(e), io)),
    }
}

/// Accepts a TLS connection over `io`, choosing its configuration with `selector` from the
/// connection's facts once the ClientHello has been read.
///
/// The ClientHello is read into the connection's own buffer and parsed there by a rustls
/// [`Acceptor`] fed a view of it, so the handshake then starts from the same bytes.
pub(crate) async fn accept<S, IO>(
    selector: &S,
    mut io: IO,
    source: std::net::SocketAddr,
    destination: std::net::SocketAddr,
) -> Result<ServerTls<IO>, AcceptError>
where
    S: CertSelector + ?Sized,
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let mut buf = ReadBuffer::new();
    let mut acceptor = Acceptor::default();
    let mut fed = 0;
    let accepted = loop {
        let n = poll_fn(|cx| {
            buf.poll_fill(
                &mut io,
                cx,
                HANDSHAKE_BUFFER,
                HANDSHAKE_BUFFER,
                MAX_HANDSHAKE_BUFFER,
            )
        })
        .await
        .map_err(AcceptError::ClientHello)?;
        if n == 0 {
            return Err(AcceptError::ClientHello(
                io::ErrorKind::UnexpectedEof.into(),
            ));
        }
        while fed < buf.buf.len() {
            let mut rest = &buf.buf[fed..];
            let taken = acceptor
                .read_tls(&mut rest)
                .map_err(AcceptError::ClientHello)?;
            if taken == 0 {
                return Err(AcceptError::ClientHello(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "ClientHello larger than accepted",
                )));
            }
            fed += taken;
        }
        match acceptor.accept() {
            Ok(None) => continue,
            Ok(Some(accepted)) => break accepted,
            Err((e, mut alert)) => {
                let mut bytes = Vec::new();
                if alert.write_all(&mut bytes).is_ok() {
                    let _ = io.write_all(&bytes).await;
                    let _ = io.flush().await;
                }
                return Err(AcceptError::ClientHello(tls_error(e)));
            }
        }
    };
    let info = ConnectionInfo::from_client_hello(&accepted.client_hello(), source, destination);
    drop(accepted);
    let Some(config) = selector.select(&info).await else {
        return Err(AcceptError::NoCertificate {
            destination,
            server_name: info.server_name,
        });
    };
    let mut config = config;
    if !config.enable_secret_extraction {
        // As for the client: a selector's shared configuration is copied, not changed.
        Arc::make_mut(&mut config).enable_secret_extraction = true;
    }
    let conn = UnbufferedServerConnection::new(config)
        .map_err(|e| AcceptError::Handshake(tls_error(e)))?;
    handshake(conn, io, buf)
        .await
        .map_err(|(e, _)| AcceptError::from_handshake(e))
}

async fn handshake<C, IO>(
    mut conn: C,
    mut io: IO,
    mut buf: ReadBuffer,
) -> Result<TlsStream<IO, C::Role>, (io::Error, IO)>
where
    C: Handshaking,
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let mut outgoing = Vec::new();
    // rustls sees the buffer up to here: one more whole record each time it is blocked, so
    // it never takes a record sent after the peer's Finished. Those are the record layer's:
    // a KeyUpdate rustls took there would have its answer queued inside rustls, which the
    // hand-over drops, and our next record would be sealed under a key the peer has not
    // moved to.
    let mut offered = 0;
    loop {
        let UnbufferedStatus { discard, state } = conn.process(&mut buf.data()[..offered]);
        let step = match state {
            Err(e) => Step::Failed(e),
            Ok(ConnectionState::EncodeTlsData(mut data)) => {
                match encode(&mut outgoing, |out| data.encode(out)) {
                    Ok(()) => Step::Continue,
                    Err(e) => Step::Failed(e),
                }
            }
            // Sent when the handshake next waits for the peer, or ends (below).
            Ok(ConnectionState::TransmitTlsData(data)) => {
                data.done();
                Step::Continue
            }
            Ok(ConnectionState::BlockedHandshake) => Step::Read,
            Ok(ConnectionState::WriteTraffic(_)) => Step::Traffic,
            Ok(ConnectionState::PeerClosed | ConnectionState::Closed) => Step::PeerClosed,
            // Application data (ReadTraffic) never comes in the records up to the peer's
            // Finished, the only ones rustls is given.
            Ok(other) => Step::Failed(TlsError::General(format!(
                "unexpected TLS state during the handshake: {other:?}"
            ))),
        };
        buf.discard(discard);
        offered -= discard;
        match step {
            // What rustls asks to have transmitted waits until the handshake must read from
            // the peer, or is over: a client's ChangeCipherSpec, encoded while the server's
            // flight is still being processed, then leaves with the flight that follows it in
            // one write (one segment), not on its own.
            Step::Continue => {}
            // A server may send application data before the client's Finished: until that
            // has been read the handshake is not over. Once it is, rustls has discarded the
            // records it was given, and what is buffered after them is the record layer's.
            Step::Traffic if !conn.common().is_handshaking() && offered == 0 => {
                if let Err(e) = transmit(&mut io, &mut outgoing).await {
                    return Err((e, io));
                }
                break;
            }
            Step::Traffic if !conn.common().is_handshaking() => {
                // rustls kept part of what it was given (it refuses bytes after a Finished
                // in the same record itself): never handed to the record layer twice. What
                // was encoded still goes, as a failure's flight does (`send_alert`).
                let _ = transmit(&mut io, &mut outgoing).await;
                let e = TlsError::PeerMisbehaved(PeerMisbehaved::KeyEpochWithPendingFragment);
                return Err((tls_error(e), io));
            }
            Step::PeerClosed => {
                return Err((tls_error(TlsError::HandshakeNotComplete), io));
            }
            Step::Read | Step::Traffic => {
                if let Some(end) = next_record_end(buf.data(), offered) {
                    offered = end;
                    continue;
                }
                // A ChangeCipherSpec alone waits for the flight after it: the peer needs
                // nothing from it, and a server flight that arrives in more than one read
                // would otherwise send it in a segment of its own.
                if outgoing != CHANGE_CIPHER_SPEC
                    && let Err(e) = transmit(&mut io, &mut outgoing).await
                {
                    return Err((e, io));
                }
                let read = poll_fn(|cx| {
                    buf.poll_fill(
                        &mut io,
                        cx,
                        HANDSHAKE_BUFFER,
                        HANDSHAKE_BUFFER,
                        MAX_HANDSHAKE_BUFFER,
                    )
                })
                .await;
                match read {
                    Ok(0) => {
                        return Err((
                            io::Error::new(io::ErrorKind::UnexpectedEof, "TLS handshake EOF"),
                            io,
                        ));
                    }
                    Ok(_) => {}
                    Err(e) => return Err((e, io)),
                }
            }
            Step::Failed(e) => {
                // The flight encoded before the failure goes first, then the alert.
                send_alert(&mut conn, &mut buf, offered, &mut io, outgoing).await;
                return Err((tls_error(e), io));
            }
        }
    }
    let peer = meshkit_identity::peer_spiffe_id(conn.common());
    let (secrets, kernel) = match conn.into_kernel() {
        Ok(parts) => parts,
        Err(e) => return Err((tls_error(e), io)),
    };
    TlsStream::new(io, kernel, secrets, peer, buf).map_err(|(e, io)| (tls_error(e), io))
}

/// The ChangeCipherSpec record TLS 1.3 peers send for middleboxes' sake (RFC 8446 appendix
/// D.4), as rustls encodes it.
const CHANGE_CIPHER_SPEC: [u8; 6] = [20, 3, 3, 0, 1, 1];

/// Writes and flushes the handshake records encoded so far, if any.
async fn transmit<IO: AsyncWrite + Unpin>(io: &mut IO, outgoing: &mut Vec<u8>) -> io::Result<()> {
    if outgoing.is_empty() {
        return Ok(());
    }
    io.write_all(outgoing).await?;
    io.flush().await?;
    outgoing.clear();
    Ok(())
}

/// The end of the record that starts at `from` in `data`, once all of it is there. rustls is
/// given whole records only, so that what it is given always ends on a record boundary; one
/// longer than a record may be is refused by rustls once it is whole (the handshake's buffer
/// holds the longest header's record).
fn next_record_end(data: &[u8], from: usize) -> Option<usize> {
    let rest = data.get(from..)?;
    let [_, _, _, hi, lo, ..] = *rest else {
        return None;
    };
    let len = usize::from(u16::from_be_bytes([hi, lo]));
    (rest.len() >= HEADER + len).then_some(from + HEADER + len)
}

/// Encodes what `encode` writes into the end of `outgoing`, grown by exactly what it needs
/// (asked first with no room at all, so no more than that is zeroed).
fn encode(
    outgoing: &mut Vec<u8>,
    mut encode: impl FnMut(&mut [u8]) -> Result<usize, EncodeError>,
) -> Result<(), TlsError> {
    let failed = |e: EncodeError| TlsError::General(format!("encoding a TLS record: {e}"));
    let needed = match encode(&mut []) {
        Ok(n) => n,
        Err(EncodeError::InsufficientSize(InsufficientSizeError { required_size })) => {
            required_size
        }
        Err(e) => return Err(failed(e)),
    };
    let start = outgoing.len();
    outgoing.resize(start + needed, 0);
    if needed > 0 {
        let n = encode(&mut outgoing[start..]).map_err(failed)?;
        outgoing.truncate(start + n);
    }
    Ok(())
}

/// After a failed handshake: writes and flushes `outgoing` (records encoded before the
/// failure, so the peer can read what follows) and the alert rustls queued, if any; the
/// connection is failing, so a failure to send them is not reported.
///
/// rustls is asked only for what it has queued: asked once more, it would read its buffer
/// again, and a record it refused while deframing would be refused twice.
async fn send_alert<C: Handshaking, IO: AsyncWrite + Unpin>(
    conn: &mut C,
    buf: &mut ReadBuffer,
    mut offered: usize,
    io: &mut IO,
    mut outgoing: Vec<u8>,
) {
    while conn.common().wants_write() {
        // With records queued, rustls hands the next one out before it reads anything.
        let UnbufferedStatus { discard, state } = conn.process(&mut buf.data()[..offered]);
        let encoded = match state {
            Ok(ConnectionState::EncodeTlsData(mut data)) => {
                encode(&mut outgoing, |out| data.encode(out)).is_ok()
            }
            _ => false,
        };
        buf.discard(discard);
        offered -= discard;
        if !encoded {
            break;
        }
    }
    if !outgoing.is_empty() {
        let _ = io.write_all(&outgoing).await;
        let _ = io.flush().await;
    }
}

fn tls_error(e: TlsError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

fn unexpected_handshake(got: HandshakeType) -> TlsError {
    TlsError::InappropriateHandshakeMessage {
        expect_types: vec![HandshakeType::KeyUpdate, HandshakeType::NewSessionTicket],
        got_type: got,
    }
}

/// The AEAD key and IV of a traffic secret.
fn key_and_iv(
    secrets: ConnectionTrafficSecrets,
) -> Result<(rustls::crypto::cipher::AeadKey, rustls::crypto::cipher::Iv), TlsError> {
    match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv }
        | ConnectionTrafficSecrets::Aes256Gcm { key, iv }
        | ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => Ok((key, iv)),
        _ => Err(TlsError::General("unsupported TLS traffic secret".into())),
    }
}

// === impl TlsStream ===

impl<IO, R: Role> TlsStream<IO, R> {
    fn new(
        io: IO,
        kernel: KernelConnection<R>,
        secrets: rustls::ExtractedSecrets,
        peer: Option<SpiffeId>,
        buf: ReadBuffer,
    ) -> Result<Self, (TlsError, IO)> {
        let Some(suite) = kernel.negotiated_cipher_suite().tls13() else {
            return Err((TlsError::General("HBONE needs TLS 1.3".into()), io));
        };
        let aead = suite.aead_alg;
        let limit = suite.common.confidentiality_limit;
        let (tx_seq, tx) = secrets.tx;
        let (rx_seq, rx) = secrets.rx;
        let keys = key_and_iv(tx).and_then(|tx| Ok((tx, key_and_iv(rx)?)));
        let ((tx_key, tx_iv), (rx_key, rx_iv)) = match keys {
            Ok(keys) => keys,
            Err(e) => return Err((e, io)),
        };
        Ok(Self {
            io,
            kernel,
            aead,
            peer,
            rx: Inbound {
                buf,
                decrypter: aead.decrypter(rx_key, rx_iv),
                seq: rx_seq,
                plain: (0, 0),
                record_end: 0,
                capacity: FIRST_DATA_BUFFER,
                handshake: Vec::new(),
                empty_records: 0,
                closed: false,
                failed: None,
            },
            tx: Outbound {
                encrypter: aead.encrypter(tx_key, tx_iv),
                seq: tx_seq,
                limit,
                queue: VecDeque::new(),
                queued: 0,
                front_sent: 0,
                key_update_owed: false,
                close_notify_sent: false,
                fatal: false,
            },
        })
    }

    /// The peer's SPIFFE ID, read from its verified certificate during the handshake.
    pub(crate) fn peer_spiffe_id(&self) -> Option<&SpiffeId> {
        self.peer.as_ref()
    }

    /// Lowers the number of records sealed under one key, to exercise KeyUpdate in tests.
    #[cfg(test)]
    fn set_confidentiality_limit(&mut self, limit: u64) {
        self.tx.limit = limit;
    }

    /// Opens the record at the front of the read buffer, if it is whole. `Ok(false)`: more
    /// bytes are needed.
    fn open_next(&mut self) -> Result<bool, TlsError> {
        let rx = &mut self.rx;
        let start = rx.buf.start;
        let Some(len) = record_len(&rx.buf.buf[start..])? else {
            return Ok(false);
        };
        let base = rx.buf.buf.as_ptr() as usize;
        let (payload_at, typ, plain_len) = {
            let record = &mut rx.buf.buf[start + HEADER..start + len];
            let msg = InboundOpaqueMessage::new(
                ContentType::ApplicationData,
                ProtocolVersion::TLSv1_2,
                record,
            );
            let plain = rx.decrypter.decrypt(msg, rx.seq)?;
            (
                plain.payload.as_ptr() as usize - base,
                plain.typ,
                plain.payload.len(),
            )
        };
        rx.seq += 1;
        rx.record_end = start + len;
        let payload = payload_at..payload_at + plain_len;
        if typ != ContentType::Handshake && !rx.handshake.is_empty() {
            return Err(PeerMisbehaved::MessageInterleavedWithHandshakeMessage.into());
        }
        // Records that bring no data (empty ones, tickets, KeyUpdates, user_canceled) each
        // cost a decryption, a KeyUpdate a key derivation too: a few in a row are normal,
        // a stream of them is not.
        if typ == ContentType::ApplicationData && plain_len > 0 {
            rx.empty_records = 0;
        } else {
            rx.empty_records += 1;
            if rx.empty_records > MAX_EMPTY_RECORDS {
                return Err(PeerMisbehaved::TooManyEmptyFragments.into());
            }
        }
        match typ {
            ContentType::ApplicationData if plain_len == 0 => rx.buf.discard(len),
            ContentType::ApplicationData => rx.plain = (payload.start, payload.end),
            ContentType::Alert => {
                let alert = &rx.buf.buf[payload];
                let [_level, description] = *alert else {
                    return Err(InvalidMessage::MessageTooShort.into());
                };
                rx.buf.discard(len);
                match AlertDescription::from(description) {
                    AlertDescription::CloseNotify => rx.closed = true,
                    AlertDescription::UserCanceled => {}
                    other => return Err(TlsError::AlertReceived(other)),
                }
            }
            ContentType::Handshake => {
                if plain_len == 0 {
                    return Err(InvalidMessage::InvalidEmptyPayload.into());
                }
                if rx.handshake.len() + plain_len > MAX_POST_HANDSHAKE_MESSAGE + 4 {
                    return Err(InvalidMessage::HandshakePayloadTooLarge.into());
                }
                rx.handshake.extend_from_slice(&rx.buf.buf[payload]);
                rx.buf.discard(len);
                self.handshake_messages()?;
            }
            other => {
                return Err(TlsError::InappropriateMessage {
                    expect_types: vec![
                        ContentType::ApplicationData,
                        ContentType::Alert,
                        ContentType::Handshake,
                    ],
                    got_type: other,
                });
            }
        }
        Ok(true)
    }

    /// Handles the whole post-handshake messages received so far.
    fn handshake_messages(&mut self) -> Result<(), TlsError> {
        let mut at = 0;
        let held = std::mem::take(&mut self.rx.handshake);
        let result = loop {
            let rest = &held[at..];
            let [typ, a, b, c, ..] = *rest else {
                break Ok(());
            };
            let len = u32::from_be_bytes([0, a, b, c]) as usize;
            if len > MAX_POST_HANDSHAKE_MESSAGE {
                break Err(InvalidMessage::HandshakePayloadTooLarge.into());
            }
            if rest.len() < 4 + len {
                break Ok(());
            }
            let body = &rest[4..4 + len];
            at += 4 + len;
            let handled = match HandshakeType::from(typ) {
                HandshakeType::KeyUpdate => {
                    // A key change ends its record (RFC 8446 section 5.1).
                    if at != held.len() {
                        Err(PeerMisbehaved::KeyEpochWithPendingFragment.into())
                    } else {
                        self.key_update(body)
                    }
                }
                HandshakeType::NewSessionTicket => R::new_session_ticket(&mut self.kernel, body),
                other => Err(unexpected_handshake(other)),
            };
            if let Err(e) = handled {
                break Err(e);
            }
        };
        result?;
        self.rx.handshake = held;
        self.rx.handshake.drain(..at);
        if self.rx.handshake.is_empty() {
            // Give back a buffer only a ticket or a key update used.
            self.rx.handshake = Vec::new();
        }
        Ok(())
    }

    /// The peer's KeyUpdate: the next receive key, and ours owed if it asks.
    fn key_update(&mut self, body: &[u8]) -> Result<(), TlsError> {
        match body {
            [0] => {}
            [1] => self.tx.key_update_owed = true,
            _ => return Err(InvalidMessage::InvalidKeyUpdate.into()),
        }
        let (seq, secrets) = self.kernel.update_rx_secret()?;
        let (key, iv) = key_and_iv(secrets)?;
        self.rx.decrypter = self.aead.decrypter(key, iv);
        self.rx.seq = seq;
        Ok(())
    }

    /// Seals one record of `typ` holding `payload`.
    fn seal(&mut self, typ: ContentType, payload: OutboundChunks<'_>) -> Result<(), TlsError> {
        let tx = &mut self.tx;
        let record = tx
            .encrypter
            .encrypt(
                OutboundPlainMessage {
                    typ,
                    version: ProtocolVersion::TLSv1_2,
                    payload,
                },
                tx.seq,
            )?
            .encode();
        tx.seq += 1;
        tx.queued += record.len();
        tx.queue.push_back(record);
        Ok(())
    }

    /// Our KeyUpdate, when the peer asked for one or this key has sealed its share of
    /// records, before the next record is sealed.
    fn key_update_if_due(&mut self) -> Result<(), TlsError> {
        let due = self.tx.seq.saturating_add(1) >= self.tx.limit;
        if !self.tx.key_update_owed && !due {
            return Ok(());
        }
        // KeyUpdate, three bytes of length, update_not_requested.
        let message = [u8::from(HandshakeType::KeyUpdate), 0, 0, 1, 0];
        self.seal(ContentType::Handshake, OutboundChunks::Single(&message))?;
        let (seq, secrets) = self.kernel.update_tx_secret()?;
        let (key, iv) = key_and_iv(secrets)?;
        self.tx.encrypter = self.aead.encrypter(key, iv);
        self.tx.seq = seq;
        self.tx.key_update_owed = false;
        Ok(())
    }

    /// Seals up to `room` bytes of `bufs` into records; returns how many.
    fn seal_data(&mut self, bufs: &[IoSlice<'_>], room: usize) -> Result<usize, TlsError> {
        let mut slices: [&[u8]; MAX_SLICES] = [&[]; MAX_SLICES];
        let mut count = 0;
        let mut total = 0;
        for b in bufs.iter().filter(|b| !b.is_empty()).take(MAX_SLICES) {
            if total >= room {
                break;
            }
            slices[count] = &b[..b.len().min(room - total)];
            total += slices[count].len();
            count += 1;
        }
        let mut rest = OutboundChunks::new(&slices[..count]);
        while !rest.is_empty() {
            self.key_update_if_due()?;
            let (record, after) = rest.split_at(MAX_FRAGMENT);
            self.seal(ContentType::ApplicationData, record)?;
            rest = after;
        }
        Ok(total)
    }
}

impl<IO: AsyncWrite + Unpin, R: Role> TlsStream<IO, R> {
    /// Writes queued records until none is left.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let tx = &mut self.tx;
        while let Some(front) = tx.queue.front() {
            let mut slices = [IoSlice::new(&[]); MAX_SLICES];
            slices[0] = IoSlice::new(&front[tx.front_sent..]);
            let mut count = 1;
            for record in tx.queue.iter().skip(1).take(MAX_SLICES - 1) {
                slices[count] = IoSlice::new(record);
                count += 1;
            }
            let mut n = ready!(Pin::new(&mut self.io).poll_write_vectored(cx, &slices[..count]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            tx.queued -= n;
            while n > 0 {
                let left = tx.queue[0].len() - tx.front_sent;
                if n < left {
                    tx.front_sent += n;
                    break;
                }
                n -= left;
                tx.front_sent = 0;
                tx.queue.pop_front();
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin, R: Role> AsyncRead for TlsStream<IO, R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            let rx = &mut this.rx;
            let (from, to) = rx.plain;
            if from < to {
                let n = (to - from).min(out.remaining());
                out.put_slice(&rx.buf.buf[from..from + n]);
                rx.plain.0 += n;
                if rx.plain.0 == to {
                    let consumed = rx.record_end - rx.buf.start;
                    rx.buf.discard(consumed);
                    rx.plain = (0, 0);
                }
                return Poll::Ready(Ok(()));
            }
            if let Some(e) = &rx.failed {
                return Poll::Ready(Err(tls_error(e.clone())));
            }
            if rx.closed || out.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            match this.open_next() {
                Ok(true) => {}
                Ok(false) => {
                    let rx = &mut this.rx;
                    let read = crate::TLS_READ_BUFFER.min(rx.capacity - MAX_RECORD);
                    let n =
                        ready!(
                            rx.buf
                                .poll_fill(&mut this.io, cx, read, rx.capacity, rx.capacity,)
                        )?;
                    if n == read {
                        rx.capacity = (rx.capacity * 2).min(DATA_BUFFER);
                    }
                    if n == 0 {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the peer closed the connection without sending TLS close_notify",
                        )));
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "TLS record refused");
                    // Our alert is the last record sealed (RFC 8446 section 6.2). None
                    // answers the peer's own fatal alert.
                    let answered = matches!(e, TlsError::AlertReceived(_));
                    if !answered && !this.tx.close_notify_sent && !this.tx.fatal {
                        let _ = this.seal_alert(alert_for(&e));
                        // Sent now, as far as the socket takes it: the layer above (h2)
                        // drops a connection whose read failed without flushing it.
                        let _ = this.poll_send(cx);
                    }
                    this.tx.fatal = true;
                    this.rx.failed = Some(e.clone());
                    return Poll::Ready(Err(tls_error(e)));
                }
            }
        }
    }
}

impl<IO, R: Role> TlsStream<IO, R> {
    fn seal_alert(&mut self, description: AlertDescription) -> Result<(), TlsError> {
        let level = if description == AlertDescription::CloseNotify {
            1
        } else {
            2
        };
        let alert = [level, u8::from(description)];
        self.seal(ContentType::Alert, OutboundChunks::Single(&alert))
    }
}

/// The alert a refused record is answered with (RFC 8446 section 6.2).
fn alert_for(e: &TlsError) -> AlertDescription {
    match e {
        TlsError::DecryptError => AlertDescription::BadRecordMac,
        TlsError::InvalidMessage(InvalidMessage::InvalidKeyUpdate) => {
            AlertDescription::IllegalParameter
        }
        TlsError::PeerSentOversizedRecord => AlertDescription::RecordOverflow,
        TlsError::InvalidMessage(_) => AlertDescription::DecodeError,
        _ => AlertDescription::UnexpectedMessage,
    }
}

/// The length of the record at the front of `buf` (header included), once its header is
/// there; `None` before. Refuses what no TLS 1.3 peer sends after its handshake.
pub(crate) fn record_len(buf: &[u8]) -> Result<Option<usize>, TlsError> {
    let [typ, major, minor, hi, lo, ..] = *buf else {
        return Ok(None);
    };
    if typ != APPLICATION_DATA {
        return Err(TlsError::InappropriateMessage {
            expect_types: vec![ContentType::ApplicationData],
            got_type: ContentType::from(typ),
        });
    }
    if [major, minor] != RECORD_VERSION {
        return Err(InvalidMessage::UnknownProtocolVersion.into());
    }
    let len = usize::from(u16::from_be_bytes([hi, lo]));
    if len > MAX_CIPHERTEXT {
        return Err(TlsError::PeerSentOversizedRecord);
    }
    if len == 0 {
        return Err(InvalidMessage::InvalidEmptyPayload.into());
    }
    Ok((buf.len() >= HEADER + len).then_some(HEADER + len))
}

impl<IO: AsyncWrite + Unpin, R: Role> AsyncWrite for TlsStream<IO, R> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.tx.fatal {
            let e = this
                .rx
                .failed
                .clone()
                .unwrap_or(TlsError::HandshakeNotComplete);
            return Poll::Ready(Err(tls_error(e)));
        }
        if this.tx.close_notify_sent {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "write after TLS close_notify",
            )));
        }
        if bufs.iter().all(|b| b.is_empty()) {
            return Poll::Ready(Ok(0));
        }
        // Backpressure: a full queue must drain first.
        if this.tx.queued >= crate::TLS_WRITE_BUFFER {
            if let Poll::Ready(result) = this.poll_send(cx) {
                result?;
            }
            if this.tx.queued >= crate::TLS_WRITE_BUFFER {
                return Poll::Pending;
            }
        }
        let room = (crate::TLS_WRITE_BUFFER - this.tx.queued).max(MAX_FRAGMENT);
        let n = this.seal_data(bufs, room).map_err(tls_error)?;
        // Send at once as far as the transport takes it; the rest goes at the next write or
        // flush. The `n` bytes are sealed and queued, so they are written whatever the
        // transport says now: a caller told otherwise would write them again. A transport's
        // error comes back from the next write or flush, which try it again.
        let _ = this.poll_send(cx);
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.tx.key_update_owed && !this.tx.close_notify_sent && !this.tx.fatal {
            this.key_update_if_due().map_err(tls_error)?;
        }
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.tx.close_notify_sent && !this.tx.fatal {
            this.seal_alert(AlertDescription::CloseNotify)
                .map_err(tls_error)?;
            this.tx.close_notify_sent = true;
        }
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

impl<IO, R: Role> std::fmt::Debug for TlsStream<IO, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsStream")
            .field("peer", &self.peer)
            .field("read_seq", &self.rx.seq)
            .field("write_seq", &self.tx.seq)
            .field("queued", &self.tx.queued)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use meshkit_identity::test_util::TestCa;
    use meshkit_identity::{Authorize, SingleIdentity, SpiffeVerifier, TlsSettings, TrustDomain};
    use proptest::prelude::*;
    use rustls::pki_types::ServerName;
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};

    use super::*;

    const CLIENT: &str = "spiffe://cluster.local/ns/a/sa/client";
    const SERVER: &str = "spiffe://cluster.local/ns/a/sa/server";

    struct Pki(TestCa);

    impl Pki {
        fn new() -> Self {
            Self(TestCa::new(TrustDomain::new("cluster.local").unwrap()))
        }

        fn client(&self) -> rustls::ClientConfig {
            TlsSettings::default()
                .client_config(
                    self.0.issue(CLIENT.parse().unwrap()),
                    SpiffeVerifier::new(self.0.bundle_set(), Authorize::AnyTrusted),
                )
                .unwrap()
        }

        fn server(&self) -> rustls::ServerConfig {
            TlsSettings::default()
                .server_config(
                    self.0.issue(SERVER.parse().unwrap()),
                    SpiffeVerifier::new(self.0.bundle_set(), Authorize::AnyTrusted),
                )
                .unwrap()
        }
    }

    fn name() -> ServerName<'static> {
        ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into())
    }

    fn addr() -> std::net::SocketAddr {
        "127.0.0.1:15008".parse().unwrap()
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
    }

    /// Our client against tokio-rustls's server, over a transport that moves at most
    /// `capacity` bytes at a time (so records arrive cut at every place).
    async fn client_pair(
        pki: &Pki,
        server: rustls::ServerConfig,
        capacity: usize,
    ) -> (
        ClientTls<DuplexStream>,
        tokio_rustls::server::TlsStream<DuplexStream>,
    ) {
        let (a, b) = tokio::io::duplex(capacity);
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let (ours, theirs) = tokio::join!(
            connect(Arc::new(pki.client()), name(), a),
            acceptor.accept(b)
        );
        (ours.map_err(|(e, _)| e).unwrap(), theirs.unwrap())
    }

    /// Our server against tokio-rustls's client.
    async fn server_pair(
        pki: &Pki,
        capacity: usize,
    ) -> (
        ServerTls<DuplexStream>,
        tokio_rustls::client::TlsStream<DuplexStream>,
    ) {
        let (a, b) = tokio::io::duplex(capacity);
        let selector = SingleIdentity::new(pki.server());
        let connector = tokio_rustls::TlsConnector::from(Arc::new(pki.client()));
        let (ours, theirs) = tokio::join!(
            accept(&selector, a, addr(), addr()),
            connector.connect(name(), b)
        );
        (ours.unwrap(), theirs.unwrap())
    }

    /// Our server over one end of an in-memory transport, and a rustls client to be driven
    /// by hand over the other: for peers that do what rustls's own driving would not.
    fn server_and_hand_driven_client(
        pki: &Pki,
    ) -> (
        SingleIdentity,
        DuplexStream,
        DuplexStream,
        rustls::ClientConnection,
    ) {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let client = rustls::ClientConnection::new(Arc::new(pki.client()), name()).unwrap();
        (SingleIdentity::new(pki.server()), a, b, client)
    }

    /// Reads once from `wire` into a hand-driven client and processes what came; `during`
    /// names the moment for the message when the server has closed.
    async fn read_into(
        client: &mut rustls::ClientConnection,
        wire: &mut DuplexStream,
        during: &str,
    ) {
        let mut buf = vec![0; 64 * 1024];
        let n = wire.read(&mut buf).await.unwrap();
        assert!(n > 0, "the server closed {during}");
        client.read_tls(&mut &buf[..n]).unwrap();
        client.process_new_packets().unwrap();
    }

    /// Sends `data` from `from` and reads it at `to` until the sender's close_notify.
    async fn send_and_close(
        from: &mut (impl AsyncWrite + Unpin),
        to: &mut (impl AsyncRead + Unpin),
        data: &[u8],
    ) -> Vec<u8> {
        let write = async {
            for piece in data.chunks(70_001) {
                from.write_all(piece).await.unwrap();
            }
            from.shutdown().await.unwrap();
        };
        let mut got = Vec::new();
        let read = to.read_to_end(&mut got);
        let ((), n) = tokio::join!(write, read);
        assert_eq!(n.unwrap(), data.len());
        got
    }

    #[tokio::test]
    async fn a_client_exchanges_records_with_a_rustls_server() {
        let pki = Pki::new();
        // A server that sends session tickets, each cut into 64-byte records as every one of
        // its messages and records is: the client joins them and hands them to rustls.
        let mut server = pki.server();
        server.send_tls13_tickets = 2;
        server.session_storage = rustls::server::ServerSessionMemoryCache::new(8);
        server.max_fragment_size = Some(64);
        let (mut ours, mut theirs) = client_pair(&pki, server, 1000).await;
        assert_eq!(ours.peer_spiffe_id().unwrap().to_string(), SERVER);
        let up = pattern(1 << 20, 1);
        assert_eq!(send_and_close(&mut ours, &mut theirs, &up).await, up);
        let down = pattern(300_007, 2);
        assert_eq!(send_and_close(&mut theirs, &mut ours, &down).await, down);
    }

    #[tokio::test]
    async fn a_server_exchanges_records_with_a_rustls_client() {
        let pki = Pki::new();
        let (mut ours, mut theirs) = server_pair(&pki, 64 * 1024).await;
        assert_eq!(ours.peer_spiffe_id().unwrap().to_string(), CLIENT);
        let up = pattern(3 << 20, 3);
        assert_eq!(send_and_close(&mut theirs, &mut ours, &up).await, up);
        let down = pattern(17, 4);
        assert_eq!(send_and_close(&mut ours, &mut theirs, &down).await, down);
    }

    #[tokio::test]
    async fn data_and_close_notify_with_the_clients_finished_are_kept() {
        let pki = Pki::new();
        let (a, b) = tokio::io::duplex(64 * 1024);
        let selector = SingleIdentity::new(pki.server());
        let connector = tokio_rustls::TlsConnector::from(Arc::new(pki.client()));
        // The client writes its Finished, data and close_notify in one turn, before the
        // server reads again: the server's handshake ends with all three in its buffer.
        let client = async {
            let mut tls = connector.connect(name(), b).await.unwrap();
            tls.write_all(b"with the finished").await.unwrap();
            tls.shutdown().await.unwrap();
            tls
        };
        let (ours, _theirs) = tokio::join!(accept(&selector, a, addr(), addr()), client);
        let mut ours = ours.unwrap();
        let mut got = Vec::new();
        ours.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"with the finished");
    }

    #[tokio::test]
    async fn a_key_update_the_peer_asks_for_is_followed_and_answered() {
        let pki = Pki::new();
        let (mut ours, mut theirs) = server_pair(&pki, 4096).await;
        let mut got = vec![0; 5];
        theirs.write_all(b"hello").await.unwrap();
        ours.read_exact(&mut got).await.unwrap();
        // rustls sends KeyUpdate(update_requested) and seals what follows with its next key.
        theirs.get_mut().1.refresh_traffic_keys().unwrap();
        theirs.write_all(b"after").await.unwrap();
        theirs.flush().await.unwrap();
        ours.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"after");
        assert!(ours.tx.key_update_owed);
        // Our answer goes before our next data, under the old key; the data under the new.
        ours.write_all(b"reply").await.unwrap();
        ours.flush().await.unwrap();
        assert!(!ours.tx.key_update_owed);
        assert_eq!(ours.tx.seq, 1);
        theirs.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"reply");
        let down = pattern(100_000, 5);
        assert_eq!(send_and_close(&mut ours, &mut theirs, &down).await, down);
    }

    #[tokio::test]
    async fn a_key_update_that_comes_with_the_clients_finished_is_answered() {
        let pki = Pki::new();
        // Once the client has read the server's Finished it asks for a KeyUpdate, which then
        // leaves in the same write as its own Finished.
        let (selector, a, mut b, mut client) = server_and_hand_driven_client(&pki);
        let handshake = async {
            loop {
                if !client.is_handshaking() {
                    client.refresh_traffic_keys().unwrap();
                }
                let mut wire = Vec::new();
                while client.wants_write() {
                    client.write_tls(&mut wire).unwrap();
                }
                b.write_all(&wire).await.unwrap();
                if !client.is_handshaking() {
                    break;
                }
                read_into(&mut client, &mut b, "during the handshake").await;
            }
        };
        let (ours, ()) = tokio::join!(accept(&selector, a, addr(), addr()), handshake);
        let mut ours = ours.unwrap();
        // The server answers the KeyUpdate before its first record under the next key.
        ours.write_all(b"reply").await.unwrap();
        ours.flush().await.unwrap();
        let mut got = Vec::new();
        while got.len() < 5 {
            read_into(&mut client, &mut b, "before its reply").await;
            let mut plain = [0; 16];
            match std::io::Read::read(&mut client.reader(), &mut plain) {
                Ok(n) => got.extend_from_slice(&plain[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("reading the reply: {e}"),
            }
        }
        assert_eq!(got, b"reply");
    }

    #[tokio::test]
    async fn an_oversized_record_in_the_handshake_is_refused_once_whole() {
        let pki = Pki::new();
        let (selector, a, mut b, mut client) = server_and_hand_driven_client(&pki);
        let peer = async {
            let mut wire = Vec::new();
            client.write_tls(&mut wire).unwrap();
            b.write_all(&wire).await.unwrap();
            // The server's flight; then, instead of ours, a record 360 bytes longer than a
            // record may be, sent in pieces smaller than the server's handshake reads.
            read_into(&mut client, &mut b, "before its flight").await;
            let len = MAX_CIPHERTEXT + 360;
            let mut record = vec![APPLICATION_DATA, 3, 3];
            record.extend_from_slice(&u16::try_from(len).unwrap().to_be_bytes());
            record.resize(HEADER + len, 0x17);
            for piece in record.chunks(3000) {
                b.write_all(piece).await.unwrap();
            }
            let mut alert = Vec::new();
            b.read_to_end(&mut alert).await.unwrap();
            alert
        };
        let (ours, alert) = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            tokio::join!(accept(&selector, a, addr(), addr()), peer)
        })
        .await
        .expect("the handshake ends");
        assert!(ours.is_err());
        // The server answered with a fatal alert under its handshake key: rustls tries to
        // open a record of up to 2^14 + 2048 bytes, and these bytes do not decrypt.
        client.read_tls(&mut &alert[..]).unwrap();
        assert_eq!(
            client.process_new_packets().unwrap_err(),
            TlsError::AlertReceived(AlertDescription::BadRecordMac)
        );
    }

    #[tokio::test]
    async fn keys_are_renewed_at_the_confidentiality_limit() {
        let pki = Pki::new();
        let (mut ours, mut theirs) = client_pair(&pki, pki.server(), 64 * 1024).await;
        // A new key every three records: 1 MiB is 64 records, so about 31 KeyUpdates.
        ours.set_confidentiality_limit(3);
        let up = pattern(1 << 20, 6);
        assert_eq!(send_and_close(&mut ours, &mut theirs, &up).await, up);
        // The last key sealed at most three records, the close_notify among them.
        assert!(
            ours.tx.seq <= 3,
            "{} records under the last key",
            ours.tx.seq
        );
    }

    #[tokio::test]
    async fn a_stream_cut_without_close_notify_is_an_error_not_an_end() {
        let pki = Pki::new();
        let (mut ours, theirs) = server_pair(&pki, 64 * 1024).await;
        let (raw, mut session) = theirs.into_inner();
        // A whole record, then the transport closes without close_notify.
        std::io::Write::write_all(&mut session.writer(), b"complete record").unwrap();
        let mut raw = raw;
        let mut wire = Vec::new();
        session.write_tls(&mut wire).unwrap();
        raw.write_all(&wire).await.unwrap();
        drop(raw);
        let mut got = vec![0; 15];
        ours.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"complete record");
        let e = ours.read(&mut got).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn a_tampered_record_is_refused_and_stays_refused() {
        let pki = Pki::new();
        let (mut ours, theirs) = server_pair(&pki, 64 * 1024).await;
        let (mut raw, mut session) = theirs.into_inner();
        std::io::Write::write_all(&mut session.writer(), &pattern(1000, 7)).unwrap();
        let mut wire = Vec::new();
        session.write_tls(&mut wire).unwrap();
        wire[100] ^= 1;
        raw.write_all(&wire).await.unwrap();
        let mut got = vec![0; 1000];
        for _ in 0..2 {
            let e = ours.read(&mut got).await.unwrap_err();
            let inner = e.get_ref().and_then(|e| e.downcast_ref::<TlsError>());
            assert_eq!(inner, Some(&TlsError::DecryptError));
        }
        // Nothing is sealed after the alert: no data, no close_notify.
        ours.write_all(b"more").await.unwrap_err();
        assert!(ours.tx.queue.is_empty());
        // The alert went to the peer with the failed read, without a flush: bad_record_mac.
        let mut alert = vec![0; 64];
        let n = raw.read(&mut alert).await.unwrap();
        session.read_tls(&mut &alert[..n]).unwrap();
        assert_eq!(
            session.process_new_packets().unwrap_err(),
            TlsError::AlertReceived(AlertDescription::BadRecordMac)
        );
    }

    #[test]
    fn record_headers_are_checked_before_anything_is_decrypted() {
        assert_eq!(record_len(&[23, 3, 3, 0]), Ok(None));
        assert_eq!(record_len(&[23, 3, 3, 0, 20, 0]), Ok(None));
        let mut whole = vec![23, 3, 3, 0, 20];
        whole.resize(25, 0);
        assert_eq!(record_len(&whole), Ok(Some(25)));
        assert_eq!(
            record_len(&[23, 3, 3, 0x41, 0x01]),
            Err(TlsError::PeerSentOversizedRecord)
        );
        assert!(record_len(&[23, 3, 3, 0x41, 0x00]).is_ok());
        assert!(record_len(&[23, 3, 3, 0, 0]).is_err());
        assert!(record_len(&[23, 3, 1, 0, 20]).is_err());
        for typ in [20, 21, 22, 24, 0, 255] {
            assert!(record_len(&[typ, 3, 3, 0, 20]).is_err(), "type {typ}");
        }
    }

    /// A transport that hands over what it holds, then ends.
    struct Wire(Vec<u8>, usize);

    impl AsyncRead for Wire {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            out: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let n = (self.0.len() - self.1).min(out.remaining()).min(977);
            let at = self.1;
            out.put_slice(&self.0[at..at + n]);
            self.1 += n;
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Wire {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            b: &[u8],
        ) -> Poll<io::Result<usize>> {
            Poll::Ready(Ok(b.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever arrives after the handshake, in whatever cuts: the stream never panics,
        /// never grows past its buffer, and never yields bytes the peer did not seal.
        #[test]
        fn hostile_records_are_refused(
            junk in proptest::collection::vec(any::<u8>(), 0..40_000),
            header in proptest::option::of((1u16..0x4200, any::<u8>())),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            runtime.block_on(async {
                let pki = Pki::new();
                let (ours, theirs) = server_pair(&pki, 64 * 1024).await;
                drop(theirs);
                // The same keys over a transport that delivers `junk`, optionally behind a
                // plausible header.
                let TlsStream { kernel, aead, peer, rx, tx, .. } = ours;
                let mut wire = Vec::new();
                if let Some((len, typ)) = header {
                    wire.extend_from_slice(&[if typ % 2 == 0 { 23 } else { typ }, 3, 3]);
                    wire.extend_from_slice(&len.to_be_bytes());
                }
                wire.extend_from_slice(&junk);
                let mut stream = TlsStream { io: Wire(wire, 0), kernel, aead, peer, rx, tx };
                let mut out = Vec::new();
                let result = stream.read_to_end(&mut out).await;
                prop_assert!(out.is_empty());
                prop_assert!(result.is_err());
                prop_assert!(stream.rx.buf.buf.capacity() <= DATA_BUFFER);
                Ok(())
            })?;
        }

        /// A server's first flight (a real one, from another handshake, so its encrypted
        /// records never open), cut anywhere, a byte changed, anything after it: the client
        /// gives rustls whole records only, and the handshake always ends with an error.
        #[test]
        fn hostile_handshakes_are_refused(
            cut in 0usize..6000,
            flip in proptest::option::of((any::<proptest::sample::Index>(), 1u8..)),
            after in proptest::collection::vec(any::<u8>(), 0..20_000),
        ) {
            let pki = Pki::new();
            let mut client = rustls::ClientConnection::new(Arc::new(pki.client()), name()).unwrap();
            let mut server = rustls::ServerConnection::new(Arc::new(pki.server())).unwrap();
            let mut hello = Vec::new();
            client.write_tls(&mut hello).unwrap();
            server.read_tls(&mut &hello[..]).unwrap();
            server.process_new_packets().unwrap();
            let mut wire = Vec::new();
            while server.wants_write() {
                server.write_tls(&mut wire).unwrap();
            }
            wire.truncate(cut);
            if let Some((at, by)) = flip.filter(|_| !wire.is_empty()) {
                let i = at.index(wire.len());
                wire[i] ^= by;
            }
            wire.extend_from_slice(&after);
            let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
            let result = runtime.block_on(async {
                tokio::time::timeout(
                    std::time::Duration::from_secs(10),
                    connect(Arc::new(pki.client()), name(), Wire(wire, 0)),
                )
                .await
            });
            prop_assert!(matches!(result, Ok(Err(_))), "not refused, or no end within 10 s");
        }
    }
}
