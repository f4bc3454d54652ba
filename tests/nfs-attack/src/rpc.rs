//! ONC RPC (RFC 5531) calls over TCP with record marking, AUTH_SYS credentials of the
//! caller's choosing, from a source address and port of the caller's choosing: what
//! a client that forges its identity controls.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::Duration;

use thiserror::Error;

use crate::xdr::{Decoder, Encoder, Truncated};

const AUTH_NONE: u32 = 0;
const AUTH_SYS: u32 = 1;
const CALL: u32 = 0;
const REPLY: u32 = 1;
const MSG_ACCEPTED: u32 = 0;
const SUCCESS: u32 = 0;
const LAST_FRAGMENT: u32 = 1 << 31;
/// Replies larger than this are not ours to read (a READDIR of a huge directory, say).
const REPLY_LIMIT: usize = 4 << 20;

#[derive(Debug, Error)]
pub enum RpcError {
    #[error("RPC transport: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Truncated(#[from] Truncated),
    /// The server answered the call but did not run it: denied (auth) or not accepted.
    #[error("RPC call refused: {0}")]
    Refused(String),
    #[error("RPC reply malformed: {0}")]
    Malformed(String),
}

/// The AUTH_SYS credential sent with every call.
#[derive(Clone, Debug)]
pub struct AuthSys {
    pub machine: String,
    pub uid: u32,
    pub gid: u32,
    pub gids: Vec<u32>,
}

impl AuthSys {
    pub fn root() -> Self {
        Self::user(0, 0)
    }

    pub fn user(uid: u32, gid: u32) -> Self {
        Self {
            machine: "nfsprov-attack".into(),
            uid,
            gid,
            gids: vec![gid],
        }
    }
}

/// Which source port a connection comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourcePort {
    /// Below 1024, as only root (or a lowered `ip_unprivileged_port_start`) can bind.
    Reserved,
    /// An ephemeral port, as any user gets.
    Unprivileged,
}

/// Where a connection comes from: a loopback address names a test client.
#[derive(Clone, Copy, Debug)]
pub struct Source {
    pub addr: Ipv4Addr,
    pub port: SourcePort,
}

pub struct RpcConnection {
    stream: TcpStream,
    next_xid: u32,
    local_port: u16,
}

impl RpcConnection {
    pub fn connect(server: SocketAddrV4, source: Source) -> Result<Self, RpcError> {
        let stream = match source.port {
            SourcePort::Unprivileged => bound_stream(server, SocketAddrV4::new(source.addr, 0))?,
            SourcePort::Reserved => reserved_stream(server, source.addr)?,
        };
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        stream.set_write_timeout(Some(Duration::from_secs(30)))?;
        stream.set_nodelay(true)?;
        let local_port = stream.local_addr()?.port();
        Ok(Self {
            stream,
            // Distinct per connection so that a server's duplicate request cache
            // never answers one connection's call with another's reply.
            next_xid: std::process::id().wrapping_mul(7919) ^ u32::from(local_port) << 16,
            local_port,
        })
    }

    pub fn local_port(&self) -> u16 {
        self.local_port
    }

    /// Calls `procedure` of `program` `version` with `args`, credential `auth`; the
    /// reply's results, undecoded.
    pub fn call(
        &mut self,
        program: u32,
        version: u32,
        procedure: u32,
        auth: &AuthSys,
        args: &[u8],
    ) -> Result<Vec<u8>, RpcError> {
        let xid = self.next_xid;
        self.next_xid = self.next_xid.wrapping_add(1);
        let mut body = Encoder::new();
        body.u32(xid)
            .u32(CALL)
            .u32(2)
            .u32(program)
            .u32(version)
            .u32(procedure);
        let mut cred = Encoder::new();
        cred.u32(0)
            .string(&auth.machine)
            .u32(auth.uid)
            .u32(auth.gid);
        cred.u32(auth.gids.len() as u32);
        for gid in &auth.gids {
            cred.u32(*gid);
        }
        body.u32(AUTH_SYS).opaque(&cred.finish());
        body.u32(AUTH_NONE).opaque(&[]);
        body.bytes(args);
        let body = body.finish();
        let mut record = Vec::with_capacity(body.len() + 4);
        record.extend_from_slice(&(LAST_FRAGMENT | body.len() as u32).to_be_bytes());
        record.extend_from_slice(&body);
        self.stream.write_all(&record)?;
        loop {
            let reply = self.read_record()?;
            let mut decoder = Decoder::new(&reply);
            if decoder.u32()? != xid {
                // A late reply to an earlier call: not this one's.
                continue;
            }
            return accepted_results(&mut decoder).map(<[u8]>::to_vec);
        }
    }

    fn read_record(&mut self) -> Result<Vec<u8>, RpcError> {
        let mut record = Vec::new();
        loop {
            let mut marker = [0u8; 4];
            self.stream.read_exact(&mut marker)?;
            let marker = u32::from_be_bytes(marker);
            let len = (marker & !LAST_FRAGMENT) as usize;
            if record.len() + len > REPLY_LIMIT {
                return Err(RpcError::Malformed(format!(
                    "reply over {REPLY_LIMIT} bytes"
                )));
            }
            let start = record.len();
            record.resize(start + len, 0);
            self.stream.read_exact(&mut record[start..])?;
            if marker & LAST_FRAGMENT != 0 {
                return Ok(record);
            }
        }
    }
}

/// The results of a reply whose xid was read: refused unless accepted and run.
fn accepted_results<'a>(decoder: &mut Decoder<'a>) -> Result<&'a [u8], RpcError> {
    if decoder.u32()? != REPLY {
        return Err(RpcError::Malformed("not a reply".into()));
    }
    let stat = decoder.u32()?;
    if stat != MSG_ACCEPTED {
        // MSG_DENIED: 0 RPC_MISMATCH, 1 AUTH_ERROR (then the auth_stat).
        let reason = decoder.u32()?;
        let detail = decoder.u32().unwrap_or(0);
        return Err(RpcError::Refused(format!(
            "denied: reject_stat {reason}, detail {detail}"
        )));
    }
    let _verifier_flavor = decoder.u32()?;
    decoder.opaque()?;
    let accept = decoder.u32()?;
    if accept != SUCCESS {
        return Err(RpcError::Refused(format!("accept_stat {accept}")));
    }
    Ok(decoder.rest())
}

/// A TCP connection to `server` from `local` (port 0: the kernel picks).
fn bound_stream(server: SocketAddrV4, local: SocketAddrV4) -> std::io::Result<TcpStream> {
    let socket = tcp_socket()?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&socket);
    sys_result(
        // SAFETY: `fd` is the open socket just made; the address is a valid sockaddr_in
        // of the size passed.
        #[allow(unsafe_code)]
        unsafe {
            let addr = sockaddr(local);
            libc::bind(
                fd,
                (&raw const addr).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        },
    )?;
    sys_result(
        // SAFETY: as for bind.
        #[allow(unsafe_code)]
        unsafe {
            let addr = sockaddr(server);
            libc::connect(
                fd,
                (&raw const addr).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        },
    )?;
    Ok(TcpStream::from(socket))
}

/// A connection from a port below 1024, tried downwards from a port that depends on
/// the process and time, so that parallel tests rarely collide.
fn reserved_stream(server: SocketAddrV4, addr: Ipv4Addr) -> Result<TcpStream, RpcError> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
        ^ std::process::id();
    let mut last = None;
    for attempt in 0..400u32 {
        let port = 600 + ((seed.wrapping_add(attempt * 37)) % 423) as u16;
        match bound_stream(server, SocketAddrV4::new(addr, port)) {
            Ok(stream) => return Ok(stream),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
            // EADDRNOTAVAIL from connect: that 4-tuple is still in TIME_WAIT.
            Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => last = Some(e),
            Err(e) => return Err(e.into()),
        }
    }
    Err(last
        .unwrap_or_else(|| std::io::Error::other("no reserved port free"))
        .into())
}

fn tcp_socket() -> std::io::Result<OwnedFd> {
    // SAFETY: socket(2) takes no pointers; a non-negative result is a new descriptor
    // that nothing else owns.
    #[allow(unsafe_code)]
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    sys_result(fd)?;
    // SAFETY: see above: `fd` is a fresh descriptor of ours.
    #[allow(unsafe_code)]
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(socket)
}

fn sockaddr(addr: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: addr.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*addr.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

fn sys_result(rc: libc::c_int) -> std::io::Result<()> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}
