//! Serving the API with limits per connection, so that no user can starve the others of the
//! controller's descriptors or time.
//!
//! Every accepted connection is charged to its peer (a uid on the Unix socket, an address on
//! TCP). A peer over [`ConnectionLimits::max_per_peer`] (root on the Unix socket excepted),
//! or any connection past
//! [`ConnectionLimits::max_connections`] (kept below the descriptor limit), is closed at
//! once. A connection that sends no request head within the header timeout (a fresh one, or
//! an idle keep-alive one) is closed by hyper; one that moves no byte either way for the idle
//! timeout (a stalled body, a client that never reads its answer) is closed by [`Watched`].
//!
//! ```
//! use wharf_controller::serve::{ConnectionLimits, Counts, PeerKey};
//! let limits = ConnectionLimits { max_connections: 3, max_per_peer: 2, ..Default::default() };
//! let counts = Counts::new();
//! let a1 = counts.admit(PeerKey::Uid(1000), &limits).unwrap();
//! let _a2 = counts.admit(PeerKey::Uid(1000), &limits).unwrap();
//! assert!(counts.admit(PeerKey::Uid(1000), &limits).is_err());
//! let _b = counts.admit(PeerKey::Uid(1001), &limits).unwrap();
//! assert!(counts.admit(PeerKey::Uid(1002), &limits).is_err()); // the global cap
//! drop(a1);
//! assert!(counts.admit(PeerKey::Uid(1000), &limits).is_ok());
//! ```

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::connect_info::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::api::Peer;

/// Descriptors kept back from the global cap for the database, the listeners, logs and the
/// blocking pool.
pub const RESERVED_FDS: u64 = 256;

/// How many connections the controller holds, and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most connections in all (lowered to the descriptor limit less [`RESERVED_FDS`]).
    pub max_connections: usize,
    /// Most connections of one user (uid) or one TCP address.
    pub max_per_peer: usize,
    /// Longest wait for a request head, on a new or a kept-alive connection.
    pub header_timeout: Duration,
    /// Longest time a connection may move no byte in either direction. Must exceed the
    /// agents' poll wait, during which a poll's answer is held back.
    pub idle_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 8192,
            max_per_peer: 64,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

impl ConnectionLimits {
    /// These limits with the global cap kept `RESERVED_FDS` below a descriptor limit of
    /// `nofile`.
    pub fn within_descriptors(mut self, nofile: u64) -> ConnectionLimits {
        let room = nofile.saturating_sub(RESERVED_FDS).max(16);
        self.max_connections = self.max_connections.min(room as usize);
        self
    }
}

/// Raises the soft limit on open descriptors to the hard limit; returns the soft limit in
/// force afterwards.
pub fn raise_nofile_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return hard;
    }
    soft
}

/// Who a connection is charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PeerKey {
    /// A local user.
    Uid(u32),
    /// A TCP client.
    Addr(IpAddr),
    /// A Unix peer whose credentials could not be read.
    Unknown,
}

impl PeerKey {
    /// The key of a peer.
    pub fn of(peer: &Peer) -> PeerKey {
        match peer {
            Peer::Local { uid, .. } => PeerKey::Uid(*uid),
            Peer::Remote(addr) => PeerKey::Addr(addr.ip()),
            Peer::Unknown => PeerKey::Unknown,
        }
    }
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The peer holds its most connections.
    PerPeer,
    /// The controller holds its most connections.
    Global,
}

#[derive(Debug, Default)]
struct Inner {
    total: usize,
    per_peer: BTreeMap<PeerKey, usize>,
}

/// Open connections, in all and per peer.
#[derive(Debug, Clone, Default)]
pub struct Counts(Arc<Mutex<Inner>>);

impl Counts {
    /// No connection yet.
    pub fn new() -> Counts {
        Counts::default()
    }

    /// Charges a new connection of `key`, or says which cap refuses it. The connection is
    /// counted until the returned [`Slot`] is dropped.
    pub fn admit(&self, key: PeerKey, limits: &ConnectionLimits) -> Result<Slot, Refused> {
        let mut inner = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mine = inner.per_peer.get(&key).copied().unwrap_or(0);
        // Root on the controller's host is its admin (or `wharf dev`'s own agent, which holds
        // a connection for each step its node's jobs run): only the global cap holds it.
        if mine >= limits.max_per_peer && key != PeerKey::Uid(0) {
            return Err(Refused::PerPeer);
        }
        if inner.total >= limits.max_connections {
            return Err(Refused::Global);
        }
        inner.total += 1;
        inner.per_peer.insert(key, mine + 1);
        Ok(Slot {
            counts: self.clone(),
            key,
        })
    }

    /// Connections open now: in all, and of `key`.
    pub fn open(&self, key: PeerKey) -> (usize, usize) {
        let inner = self.0.lock().unwrap_or_else(|p| p.into_inner());
        (inner.total, inner.per_peer.get(&key).copied().unwrap_or(0))
    }
}

/// One admitted connection; dropping it frees its place.
#[derive(Debug)]
pub struct Slot {
    counts: Counts,
    key: PeerKey,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut inner = self.counts.0.lock().unwrap_or_else(|p| p.into_inner());
        inner.total = inner.total.saturating_sub(1);
        if let Some(n) = inner.per_peer.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                inner.per_peer.remove(&self.key);
            }
        }
    }
}

/// A stream that fails with `TimedOut` once it has moved no byte for its idle timeout while
/// someone waits on it.
#[derive(Debug)]
pub struct Watched<S> {
    inner: S,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl<S> Watched<S> {
    /// Watches `inner`.
    pub fn new(inner: S, idle: Duration) -> Watched<S> {
        Watched {
            inner,
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
        }
    }

    fn moved(&mut self) {
        let next = Instant::now() + self.idle;
        self.deadline.as_mut().reset(next);
    }

    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.deadline.as_mut().poll(cx).is_ready()
    }
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "connection idle for too long")
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.moved();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(timed_out())),
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.moved();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(timed_out())),
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(timed_out())),
            other => other,
        }
    }

    /// Bounded too: a TLS stream's shutdown writes its close_notify, which a peer that reads
    /// nothing could hold up for ever.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_shutdown(cx) {
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(timed_out())),
            other => other,
        }
    }
}

/// A listener the server accepts from, with the peer of each connection.
pub trait Accept: Send + 'static {
    /// The connection type.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// Waits for the next connection.
    fn accept(&self) -> impl Future<Output = io::Result<(Self::Io, Peer)>> + Send;
}

impl Accept for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept(&self) -> io::Result<(Self::Io, Peer)> {
        let (s, _) = tokio::net::UnixListener::accept(self).await?;
        let peer = match s.peer_cred() {
            Ok(c) => Peer::Local {
                uid: c.uid(),
                gid: c.gid(),
            },
            Err(_) => Peer::Unknown,
        };
        Ok((s, peer))
    }
}

impl Accept for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept(&self) -> io::Result<(Self::Io, Peer)> {
        let (s, addr) = tokio::net::TcpListener::accept(self).await?;
        Ok((s, Peer::Remote(addr)))
    }
}

/// Accepts connections from `listener` and serves `app` on each, within `limits`. Returns
/// only on a listener error that is not about one connection or a passing shortage.
pub async fn serve<L: Accept>(
    listener: L,
    app: Router,
    limits: ConnectionLimits,
    counts: Counts,
) -> io::Result<()> {
    let mut warned: BTreeMap<PeerKey, Instant> = BTreeMap::new();
    loop {
        let (io, peer) = next_connection(&listener).await?;
        let key = PeerKey::of(&peer);
        let slot = match counts.admit(key, &limits) {
            Ok(s) => s,
            Err(why) => {
                // Closed at once (dropping it); said in the log at most once a minute a peer.
                let now = Instant::now();
                if warned
                    .get(&key)
                    .is_none_or(|t| now.duration_since(*t) > Duration::from_secs(60))
                {
                    let (total, mine) = counts.open(key);
                    tracing::warn!(peer = ?key, ?why, total, mine, "refusing connections");
                    warned.insert(key, now);
                }
                continue;
            }
        };
        let app = app.clone();
        let limits = limits.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |mut req| {
                req.extensions_mut().insert(ConnectInfo(peer.clone()));
                tower_service::Service::call(&mut app.clone(), req)
            });
            let conn = http1(io, service, &limits);
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended");
            }
            drop(slot);
        });
    }
}

/// How the TCP listener admits connections. Jobs share their node's network, so a job's
/// process connects from its agent's address: a cap per address would let any job lock its
/// node's agent out. Instead a connection is charged to a small pool of unauthenticated
/// connections until a request on it shows the join token; then it moves to the agents' pool
/// ([`ConnectionLimits::max_connections`] and `max_per_peer`), where no one without the token
/// can take its place. When the unauthenticated pool is full, its oldest connection is closed
/// for the newcomer: an agent sends its request with the token at once, so it is promoted
/// long before connections held idle, which are also closed after
/// [`TcpLimits::unauthenticated_timeout`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpLimits {
    /// Most connections that have not shown the join token.
    pub max_unauthenticated: usize,
    /// Longest a connection may stay without showing the join token.
    pub unauthenticated_timeout: Duration,
}

impl Default for TcpLimits {
    fn default() -> Self {
        TcpLimits {
            max_unauthenticated: 64,
            unauthenticated_timeout: Duration::from_secs(3),
        }
    }
}

/// The TCP listener's admission: unauthenticated connections (oldest closed first when full)
/// and agents' connections.
#[derive(Debug, Clone)]
pub struct Gate(Arc<GateInner>);

#[derive(Debug)]
struct GateInner {
    keys: Arc<crate::node_keys::NodeKeys>,
    tcp: TcpLimits,
    limits: ConnectionLimits,
    agents: Counts,
    pending: Mutex<Pending>,
}

#[derive(Debug, Default)]
struct Pending {
    next: u64,
    /// Oldest first: a connection's number and how to close it.
    queue: std::collections::VecDeque<(u64, Arc<tokio::sync::Notify>)>,
}

/// A connection's place in the [`Gate`].
#[derive(Debug)]
pub struct Ticket {
    gate: Gate,
    id: u64,
    /// Told when the connection must close to make room.
    pub evicted: Arc<tokio::sync::Notify>,
    agent: Mutex<Option<Slot>>,
}

impl Gate {
    /// A gate for agents presenting the join token or a node's key (`keys`); agents'
    /// connections are capped by `limits`.
    pub fn new(
        keys: Arc<crate::node_keys::NodeKeys>,
        tcp: TcpLimits,
        limits: ConnectionLimits,
    ) -> Gate {
        Gate(Arc::new(GateInner {
            keys,
            tcp,
            limits,
            agents: Counts::new(),
            pending: Mutex::default(),
        }))
    }

    /// Admits a new connection as unauthenticated, closing the oldest unauthenticated one
    /// when the pool is full.
    pub fn enter(&self) -> Ticket {
        let evicted = Arc::new(tokio::sync::Notify::new());
        let mut p = self.0.pending.lock().unwrap_or_else(|e| e.into_inner());
        while p.queue.len() >= self.0.tcp.max_unauthenticated.max(1) {
            if let Some((_, oldest)) = p.queue.pop_front() {
                oldest.notify_one();
            }
        }
        let id = p.next;
        p.next += 1;
        p.queue.push_back((id, evicted.clone()));
        Ticket {
            gate: self.clone(),
            id,
            evicted,
            agent: Mutex::new(None),
        }
    }

    /// Unauthenticated connections open now.
    pub fn unauthenticated(&self) -> usize {
        self.0
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .queue
            .len()
    }

    /// Agents' connections open now, in all.
    pub fn agents(&self) -> usize {
        self.0.agents.open(PeerKey::Unknown).0
    }

    /// True when `headers` carry the join token or a node's key.
    fn has_token(&self, headers: &axum::http::HeaderMap) -> bool {
        self.0.keys.check(headers).is_some()
    }
}

impl Ticket {
    /// True once a request on this connection showed the join token.
    pub fn authenticated(&self) -> bool {
        self.agent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Moves the connection to the agents' pool when `headers` carry the join token and the
    /// pool has room (charged to `key`). Idempotent.
    fn present(&self, headers: &axum::http::HeaderMap, key: PeerKey) {
        if self.authenticated() || !self.gate.has_token(headers) {
            return;
        }
        let Ok(slot) = self.gate.0.agents.admit(key, &self.gate.0.limits) else {
            return;
        };
        *self.agent.lock().unwrap_or_else(|e| e.into_inner()) = Some(slot);
        self.leave_pending();
    }

    fn leave_pending(&self) {
        let mut p = self
            .gate
            .0
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        p.queue.retain(|(id, _)| *id != self.id);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.leave_pending();
    }
}

/// Serves `app` on TLS connections over TCP from `listener`, admitted through `gate` (see
/// [`TcpLimits`]). The handshake is part of a connection's unauthenticated time. Returns
/// only on a listener error that is not about one connection or a passing shortage.
pub async fn serve_tcp(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: ConnectionLimits,
    gate: Gate,
    tls: Arc<rustls::ServerConfig>,
) -> io::Result<()> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut warned: Option<Instant> = None;
    loop {
        let (io, peer) = next_connection(&listener).await?;
        let key = PeerKey::of(&peer);
        if gate.unauthenticated() >= gate.0.tcp.max_unauthenticated {
            let now = Instant::now();
            if warned.is_none_or(|t| now.duration_since(t) > Duration::from_secs(60)) {
                tracing::warn!(peer = ?key, "unauthenticated TCP connections at their cap; closing the oldest");
                warned = Some(now);
            }
        }
        let ticket = Arc::new(gate.enter());
        let app = app.clone();
        let limits = limits.clone();
        let timeout = gate.0.tcp.unauthenticated_timeout;
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let deadline = tokio::time::sleep(timeout);
            tokio::pin!(deadline);
            // Nothing is read in the clear: a connection that does not finish its handshake
            // within the unauthenticated time, or is evicted first, is closed.
            let io = tokio::select! {
                r = acceptor.accept(io) => match r {
                    Ok(io) => io,
                    Err(e) => {
                        tracing::debug!(peer = ?key, error = %e, "TLS handshake failed");
                        return;
                    }
                },
                () = ticket.evicted.notified() => return,
                () = &mut deadline => return,
            };
            let t = ticket.clone();
            let service = hyper::service::service_fn(move |mut req: axum::http::Request<_>| {
                t.present(req.headers(), key);
                req.extensions_mut().insert(ConnectInfo(peer.clone()));
                tower_service::Service::call(&mut app.clone(), req)
            });
            let conn = http1(io, service, &limits);
            tokio::pin!(conn);
            let mut timer_done = false;
            loop {
                tokio::select! {
                    r = &mut conn => {
                        if let Err(e) = r {
                            tracing::debug!(error = %e, "connection ended");
                        }
                        break;
                    }
                    // Only unauthenticated connections are in the queue that evicts; one
                    // promoted just as it was picked) ignores it.
                    () = ticket.evicted.notified() => {
                        if !ticket.authenticated() {
                            break;
                        }
                    }
                    () = &mut deadline, if !timer_done => {
                        timer_done = true;
                        if !ticket.authenticated() {
                            break;
                        }
                    }
                }
            }
            drop(ticket);
        });
    }
}

/// `io` served by `service` as one HTTP/1 connection, within `limits`' header and idle
/// timeouts.
fn http1<I, S>(
    io: I,
    service: S,
    limits: &ConnectionLimits,
) -> hyper::server::conn::http1::Connection<TokioIo<Watched<I>>, S>
where
    I: AsyncRead + AsyncWrite + Unpin,
    S: hyper::service::HttpService<hyper::body::Incoming>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::ResBody: 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(TokioIo::new(Watched::new(io, limits.idle_timeout)), service)
}

/// The next connection from `listener`. An error that passes ([`is_passing`]) is logged and
/// waited out; any other is returned.
async fn next_connection<L: Accept>(listener: &L) -> io::Result<(L::Io, Peer)> {
    loop {
        match listener.accept().await {
            Ok(c) => return Ok(c),
            Err(e) if is_passing(&e) => {
                // Out of descriptors or memory for now: let connections end, then go on.
                tracing::warn!(error = %e, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Accept errors that pass: about one connection, or a shortage of descriptors or memory.
fn is_passing(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EMFILE
                | libc::ENFILE
                | libc::ENOBUFS
                | libc::ENOMEM
                | libc::ECONNABORTED
                | libc::EINTR
                | libc::EPROTO
                | libc::EPERM
        )
    ) || matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_global_cap_stays_below_the_descriptor_limit() {
        let l = ConnectionLimits::default().within_descriptors(1024);
        assert_eq!(l.max_connections, 1024 - RESERVED_FDS as usize);
        let l = ConnectionLimits::default().within_descriptors(1 << 20);
        assert_eq!(l.max_connections, 8192);
    }

    #[test]
    fn peers_are_capped_apart() {
        let limits = ConnectionLimits {
            max_connections: 100,
            max_per_peer: 2,
            ..Default::default()
        };
        let c = Counts::new();
        let slots: Vec<Slot> = (0..2)
            .map(|_| c.admit(PeerKey::Uid(7), &limits).unwrap())
            .collect();
        assert_eq!(
            c.admit(PeerKey::Uid(7), &limits).err(),
            Some(Refused::PerPeer)
        );
        let tcp = PeerKey::Addr("10.0.0.1".parse().unwrap());
        assert!(c.admit(tcp, &limits).is_ok());
        assert_eq!(c.open(PeerKey::Uid(7)), (2, 2));
        // Root is held by the global cap alone.
        let root: Vec<Slot> = (0..5)
            .map(|_| c.admit(PeerKey::Uid(0), &limits).unwrap())
            .collect();
        assert_eq!(c.open(PeerKey::Uid(0)), (7, 5));
        drop(root);
        drop(slots);
        assert_eq!(c.open(PeerKey::Uid(7)), (0, 0));
    }

    fn keys(join_token: &str) -> Arc<crate::node_keys::NodeKeys> {
        Arc::new(crate::node_keys::NodeKeys::new(join_token, vec![]))
    }

    fn bearer(token: &str) -> axum::http::HeaderMap {
        let mut h = axum::http::HeaderMap::new();
        h.insert("authorization", format!("Bearer {token}").parse().unwrap());
        h
    }

    #[test]
    fn the_oldest_unauthenticated_connection_makes_room_and_agents_are_kept() {
        let tcp = TcpLimits {
            max_unauthenticated: 2,
            ..Default::default()
        };
        let gate = Gate::new(keys("secret"), tcp, ConnectionLimits::default());
        let key = PeerKey::Addr("127.0.0.1".parse().unwrap());
        let agent = gate.enter();
        agent.present(&bearer("secret"), key);
        assert!(agent.authenticated());
        let idle: Vec<Ticket> = (0..2).map(|_| gate.enter()).collect();
        assert_eq!((gate.unauthenticated(), gate.agents()), (2, 1));
        // A wrong token promotes nothing.
        idle[1].present(&bearer("secreT"), key);
        idle[1].present(&axum::http::HeaderMap::new(), key);
        assert!(!idle[1].authenticated());
        // A newcomer closes the oldest unauthenticated connection, never the agent's.
        let newcomer = gate.enter();
        assert_eq!(gate.unauthenticated(), 2);
        let evicted = |t: &Ticket| {
            let n = t.evicted.notified();
            tokio::pin!(n);
            n.as_mut().enable()
        };
        assert!(evicted(&idle[0]));
        assert!(!evicted(&idle[1]) && !evicted(&agent));
        // The newcomer shows the token: it moves to the agents' pool.
        newcomer.present(&bearer("secret"), key);
        assert_eq!((gate.unauthenticated(), gate.agents()), (1, 2));
        drop(newcomer);
        drop(agent);
        drop(idle);
        assert_eq!((gate.unauthenticated(), gate.agents()), (0, 0));
    }

    #[test]
    fn a_nodes_key_promotes_its_connection_and_a_forgotten_or_unknown_one_does_not() {
        let keys = keys("secret");
        let node_key = crate::node_keys::tests::key(1);
        keys.insert("n1", crate::node_keys::hash(&node_key));
        let gate = Gate::new(
            keys.clone(),
            TcpLimits::default(),
            ConnectionLimits::default(),
        );
        let key = PeerKey::Addr("127.0.0.1".parse().unwrap());
        let stranger = gate.enter();
        stranger.present(&bearer(&crate::node_keys::tests::key(2)), key);
        assert!(!stranger.authenticated());
        let agent = gate.enter();
        agent.present(&bearer(&node_key), key);
        assert!(agent.authenticated());
        keys.remove("n1");
        let later = gate.enter();
        later.present(&bearer(&node_key), key);
        assert!(!later.authenticated());
    }

    #[test]
    fn no_token_configured_promotes_nobody() {
        let gate = Gate::new(keys(""), TcpLimits::default(), ConnectionLimits::default());
        let t = gate.enter();
        t.present(&bearer(""), PeerKey::Unknown);
        assert!(!t.authenticated());
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_stream_times_out_and_a_busy_one_does_not() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (a, mut b) = tokio::io::duplex(64);
        let mut w = Watched::new(a, Duration::from_secs(5));
        let mut buf = [0u8; 8];
        b.write_all(b"x").await.unwrap();
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(w.read(&mut buf).await.unwrap(), 1);
        tokio::time::advance(Duration::from_secs(4)).await;
        // Four seconds after the last byte: still alive; then silence past five.
        let read = w.read(&mut buf).await;
        assert_eq!(read.unwrap_err().kind(), io::ErrorKind::TimedOut);
    }

    /// A TLS stream's shutdown writes its close_notify; a peer that reads nothing must not
    /// hold the connection (and its slot) for ever. Without the bound this never returns.
    #[tokio::test(start_paused = true)]
    async fn a_shutdown_the_peer_never_lets_finish_times_out() {
        use tokio::io::AsyncWriteExt;
        struct Stuck;
        impl AsyncWrite for Stuck {
            fn poll_write(
                self: Pin<&mut Self>,
                _: &mut Context<'_>,
                _: &[u8],
            ) -> Poll<io::Result<usize>> {
                Poll::Pending
            }
            fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Pending
            }
            fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Pending
            }
        }
        let mut w = Watched::new(Stuck, Duration::from_secs(5));
        let shut = tokio::time::timeout(Duration::from_secs(60), w.shutdown()).await;
        assert_eq!(
            shut.expect("the shutdown was bounded").unwrap_err().kind(),
            io::ErrorKind::TimedOut
        );
    }
}
