//! NFSv4.0 COMPOUNDs (RFC 7530), only the operations an attacker needs: set a file
//! handle (PUTROOTFH, PUTFH), walk (LOOKUP), show the handle (GETFH), look (GETATTR,
//! READDIR), and read and write (with the anonymous stateid, or after OPEN).

use std::fmt;
use std::net::SocketAddrV4;

use thiserror::Error;

use crate::rpc::{AuthSys, RpcConnection, RpcError, Source};
use crate::xdr::{Decoder, Encoder, Truncated};

const NFS_PROGRAM: u32 = 100_003;
const NFS_V4: u32 = 4;
const COMPOUND: u32 = 1;

const OP_CLOSE: u32 = 4;
const OP_GETATTR: u32 = 9;
const OP_GETFH: u32 = 10;
const OP_LOOKUP: u32 = 15;
const OP_OPEN: u32 = 18;
const OP_OPEN_CONFIRM: u32 = 20;
const OP_PUTFH: u32 = 22;
const OP_PUTROOTFH: u32 = 24;
const OP_READ: u32 = 25;
const OP_READDIR: u32 = 26;
const OP_SETCLIENTID: u32 = 35;
const OP_SETCLIENTID_CONFIRM: u32 = 36;
const OP_WRITE: u32 = 38;

/// The attributes GETATTR asks for: type, fsid, fileid (bits 1, 8 and 20 of word 0).
const ATTR_TYPE: u32 = 1;
const ATTR_FSID: u32 = 8;
const ATTR_FILEID: u32 = 20;
const OPEN4_RESULT_CONFIRM: u32 = 2;
const FILE_SYNC4: u32 = 2;

#[derive(Debug, Error)]
pub enum NfsError {
    #[error(transparent)]
    Rpc(#[from] RpcError),
    #[error(transparent)]
    Truncated(#[from] Truncated),
    #[error("{op} answered {status}")]
    Status { op: &'static str, status: Status },
}

impl NfsError {
    /// The NFS status, when the server ran the call and an operation failed.
    pub fn status(&self) -> Option<Status> {
        match self {
            NfsError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// An nfsstat4.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status(pub u32);

impl Status {
    pub const OK: Status = Status(0);

    pub fn is_ok(self) -> bool {
        self == Self::OK
    }

    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "NFS4_OK",
            1 => "NFS4ERR_PERM",
            2 => "NFS4ERR_NOENT",
            5 => "NFS4ERR_IO",
            13 => "NFS4ERR_ACCESS",
            20 => "NFS4ERR_NOTDIR",
            21 => "NFS4ERR_ISDIR",
            22 => "NFS4ERR_INVAL",
            30 => "NFS4ERR_ROFS",
            70 => "NFS4ERR_STALE",
            10001 => "NFS4ERR_BADHANDLE",
            10004 => "NFS4ERR_NOTSUPP",
            10006 => "NFS4ERR_SERVERFAULT",
            10008 => "NFS4ERR_DELAY",
            10011 => "NFS4ERR_EXPIRED",
            10013 => "NFS4ERR_GRACE",
            10014 => "NFS4ERR_FHEXPIRED",
            10015 => "NFS4ERR_SHARE_DENIED",
            10016 => "NFS4ERR_WRONGSEC",
            10018 => "NFS4ERR_RESOURCE",
            10019 => "NFS4ERR_MOVED",
            10020 => "NFS4ERR_NOFILEHANDLE",
            10022 => "NFS4ERR_STALE_CLIENTID",
            10023 => "NFS4ERR_STALE_STATEID",
            10025 => "NFS4ERR_BAD_STATEID",
            10026 => "NFS4ERR_BAD_SEQID",
            10036 => "NFS4ERR_BADXDR",
            10038 => "NFS4ERR_OPENMODE",
            _ => "NFS4ERR_(other)",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// A stateid4: the all-zero one is the anonymous stateid, I/O without OPEN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateId {
    pub seqid: u32,
    pub other: [u8; 12],
}

impl StateId {
    pub const ANONYMOUS: StateId = StateId {
        seqid: 0,
        other: [0; 12],
    };

    fn encode(&self, encoder: &mut Encoder) {
        encoder.u32(self.seqid).bytes(&self.other);
    }

    fn decode(decoder: &mut Decoder<'_>) -> Result<Self, Truncated> {
        let seqid = decoder.u32()?;
        let mut other = [0; 12];
        other.copy_from_slice(decoder.fixed(12)?);
        Ok(Self { seqid, other })
    }
}

/// One operation of a COMPOUND.
#[derive(Clone, Debug)]
pub enum Op {
    PutRootFh,
    PutFh(Vec<u8>),
    Lookup(String),
    GetFh,
    GetAttr,
    ReadDir {
        cookie: u64,
        verifier: [u8; 8],
    },
    Read {
        stateid: StateId,
        offset: u64,
        count: u32,
    },
    Write {
        stateid: StateId,
        offset: u64,
        data: Vec<u8>,
    },
    SetClientId {
        verifier: [u8; 8],
        id: Vec<u8>,
    },
    SetClientIdConfirm {
        clientid: u64,
        verifier: [u8; 8],
    },
    /// OPEN of an existing file by name in the current directory, CLAIM_NULL.
    Open {
        seqid: u32,
        access: u32,
        clientid: u64,
        owner: Vec<u8>,
        name: String,
    },
    OpenConfirm {
        stateid: StateId,
        seqid: u32,
    },
    Close {
        seqid: u32,
        stateid: StateId,
    },
}

impl Op {
    fn number(&self) -> u32 {
        match self {
            Op::PutRootFh => OP_PUTROOTFH,
            Op::PutFh(_) => OP_PUTFH,
            Op::Lookup(_) => OP_LOOKUP,
            Op::GetFh => OP_GETFH,
            Op::GetAttr => OP_GETATTR,
            Op::ReadDir { .. } => OP_READDIR,
            Op::Read { .. } => OP_READ,
            Op::Write { .. } => OP_WRITE,
            Op::SetClientId { .. } => OP_SETCLIENTID,
            Op::SetClientIdConfirm { .. } => OP_SETCLIENTID_CONFIRM,
            Op::Open { .. } => OP_OPEN,
            Op::OpenConfirm { .. } => OP_OPEN_CONFIRM,
            Op::Close { .. } => OP_CLOSE,
        }
    }

    fn encode(&self, e: &mut Encoder) {
        e.u32(self.number());
        match self {
            Op::PutRootFh | Op::GetFh => {}
            Op::PutFh(handle) => {
                e.opaque(handle);
            }
            Op::Lookup(name) => {
                e.string(name);
            }
            Op::GetAttr => {
                e.u32(1)
                    .u32((1 << ATTR_TYPE) | (1 << ATTR_FSID) | (1 << ATTR_FILEID));
            }
            Op::ReadDir { cookie, verifier } => {
                // Names only: no attributes asked.
                e.u64(*cookie).fixed(verifier).u32(8192).u32(32768).u32(0);
            }
            Op::Read {
                stateid,
                offset,
                count,
            } => {
                stateid.encode(e);
                e.u64(*offset).u32(*count);
            }
            Op::Write {
                stateid,
                offset,
                data,
            } => {
                stateid.encode(e);
                e.u64(*offset).u32(FILE_SYNC4).opaque(data);
            }
            Op::SetClientId { verifier, id } => {
                // No callback: a program number and an address nobody serves.
                e.fixed(verifier)
                    .opaque(id)
                    .u32(0x4000_0000)
                    .string("tcp")
                    .string("127.0.0.1.0.0")
                    .u32(1);
            }
            Op::SetClientIdConfirm { clientid, verifier } => {
                e.u64(*clientid).fixed(verifier);
            }
            Op::Open {
                seqid,
                access,
                clientid,
                owner,
                name,
            } => {
                // share_deny NONE, OPEN4_NOCREATE, CLAIM_NULL by name.
                e.u32(*seqid)
                    .u32(*access)
                    .u32(0)
                    .u64(*clientid)
                    .opaque(owner)
                    .u32(0)
                    .u32(0)
                    .string(name);
            }
            Op::OpenConfirm { stateid, seqid } => {
                stateid.encode(e);
                e.u32(*seqid);
            }
            Op::Close { seqid, stateid } => {
                e.u32(*seqid);
                stateid.encode(e);
            }
        }
    }
}

/// What a successful operation returned beyond its status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Done,
    Handle(Vec<u8>),
    Attrs(Attrs),
    Entries {
        names: Vec<String>,
        last_cookie: u64,
        verifier: [u8; 8],
        eof: bool,
    },
    Data {
        data: Vec<u8>,
        eof: bool,
    },
    Written(u32),
    ClientId {
        clientid: u64,
        verifier: [u8; 8],
    },
    Opened {
        stateid: StateId,
        confirm: bool,
    },
    StateId(StateId),
}

/// The attributes GETATTR returned (those the server had).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attrs {
    pub kind: Option<u32>,
    pub fsid: Option<(u64, u64)>,
    pub fileid: Option<u64>,
}

/// One operation's result.
#[derive(Clone, Debug)]
pub struct OpResult {
    pub op: u32,
    pub status: Status,
    pub answer: Answer,
}

/// A COMPOUND's reply: its status (that of the last operation run) and the results of
/// the operations run, up to and including the first that failed.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: Status,
    pub results: Vec<OpResult>,
}

impl Reply {
    /// The answer of the last operation, or the failure that stopped the compound.
    pub fn last(self, what: &'static str) -> Result<Answer, NfsError> {
        if !self.status.is_ok() {
            return Err(NfsError::Status {
                op: what,
                status: self.status,
            });
        }
        Ok(self
            .results
            .into_iter()
            .last()
            .map(|r| r.answer)
            .unwrap_or(Answer::Done))
    }

    /// The status of the first operation that failed, with its position; `None` if all ran.
    pub fn failure(&self) -> Option<(usize, Status)> {
        self.results
            .iter()
            .position(|r| !r.status.is_ok())
            .map(|i| (i, self.results[i].status))
    }
}

/// An NFSv4.0 client on one TCP connection, with one identity.
pub struct Client {
    rpc: RpcConnection,
    auth: AuthSys,
    /// The confirmed client id, once SETCLIENTID has been done.
    clientid: Option<u64>,
    open_seqid: u32,
}

impl Client {
    pub fn connect(server: SocketAddrV4, source: Source, auth: AuthSys) -> Result<Self, NfsError> {
        Ok(Self {
            rpc: RpcConnection::connect(server, source)?,
            auth,
            clientid: None,
            open_seqid: 0,
        })
    }

    /// The source port the connection came from.
    pub fn local_port(&self) -> u16 {
        self.rpc.local_port()
    }

    pub fn compound(&mut self, ops: &[Op]) -> Result<Reply, NfsError> {
        let mut args = Encoder::new();
        args.string("nfsprov-attack").u32(0).u32(ops.len() as u32);
        for op in ops {
            op.encode(&mut args);
        }
        let reply = self
            .rpc
            .call(NFS_PROGRAM, NFS_V4, COMPOUND, &self.auth, &args.finish())?;
        decode_reply(&reply)
    }

    /// The handle of `path` (components from the pseudo-root).
    pub fn lookup_path(&mut self, path: &[&str]) -> Result<Vec<u8>, NfsError> {
        let mut ops = vec![Op::PutRootFh];
        ops.extend(path.iter().map(|c| Op::Lookup((*c).to_owned())));
        ops.push(Op::GetFh);
        self.handle_of(ops)
    }

    /// The handle of `path` (components) below the object of `handle`.
    pub fn lookup_from(&mut self, handle: &[u8], path: &[&str]) -> Result<Vec<u8>, NfsError> {
        let mut ops = vec![Op::PutFh(handle.to_vec())];
        ops.extend(path.iter().map(|c| Op::Lookup((*c).to_owned())));
        ops.push(Op::GetFh);
        self.handle_of(ops)
    }

    fn handle_of(&mut self, ops: Vec<Op>) -> Result<Vec<u8>, NfsError> {
        match self.compound(&ops)?.last("LOOKUP")? {
            Answer::Handle(handle) => Ok(handle),
            other => unreachable_answer("GETFH", &other),
        }
    }

    /// GETATTR of the object of `handle`.
    pub fn attrs(&mut self, handle: &[u8]) -> Result<Attrs, NfsError> {
        match self
            .compound(&[Op::PutFh(handle.to_vec()), Op::GetAttr])?
            .last("GETATTR")?
        {
            Answer::Attrs(attrs) => Ok(attrs),
            other => unreachable_answer("GETATTR", &other),
        }
    }

    /// The names in the directory of `handle`, or in the pseudo-root when `None`.
    pub fn list(&mut self, handle: Option<&[u8]>) -> Result<Vec<String>, NfsError> {
        let start = match handle {
            Some(handle) => Op::PutFh(handle.to_vec()),
            None => Op::PutRootFh,
        };
        let mut all = Vec::new();
        let (mut cookie, mut verifier) = (0, [0; 8]);
        loop {
            let answer = self
                .compound(&[start.clone(), Op::ReadDir { cookie, verifier }])?
                .last("READDIR")?;
            let Answer::Entries {
                names,
                last_cookie,
                verifier: next,
                eof,
            } = answer
            else {
                return unreachable_answer("READDIR", &answer);
            };
            let empty = names.is_empty();
            all.extend(names);
            if eof || empty {
                all.sort();
                return Ok(all);
            }
            (cookie, verifier) = (last_cookie, next);
        }
    }

    /// Reads up to `count` bytes at 0 of the file of `handle` with `stateid`.
    pub fn read(
        &mut self,
        handle: &[u8],
        stateid: StateId,
        count: u32,
    ) -> Result<Vec<u8>, NfsError> {
        let ops = [
            Op::PutFh(handle.to_vec()),
            Op::Read {
                stateid,
                offset: 0,
                count,
            },
        ];
        match self.compound(&ops)?.last("READ")? {
            Answer::Data { data, .. } => Ok(data),
            other => unreachable_answer("READ", &other),
        }
    }

    /// Writes `data` at `offset` of the file of `handle` with `stateid`, FILE_SYNC.
    pub fn write(
        &mut self,
        handle: &[u8],
        stateid: StateId,
        offset: u64,
        data: &[u8],
    ) -> Result<u32, NfsError> {
        let ops = [
            Op::PutFh(handle.to_vec()),
            Op::Write {
                stateid,
                offset,
                data: data.to_vec(),
            },
        ];
        match self.compound(&ops)?.last("WRITE")? {
            Answer::Written(count) => Ok(count),
            other => unreachable_answer("WRITE", &other),
        }
    }

    /// SETCLIENTID and its confirmation, once per client.
    pub fn establish(&mut self) -> Result<u64, NfsError> {
        if let Some(clientid) = self.clientid {
            return Ok(clientid);
        }
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let id = format!(
            "nfsprov-attack-{}-{}-{stamp}",
            std::process::id(),
            self.local_port()
        );
        let answer = self
            .compound(&[Op::SetClientId {
                verifier: stamp.to_be_bytes(),
                id: id.into_bytes(),
            }])?
            .last("SETCLIENTID")?;
        let Answer::ClientId { clientid, verifier } = answer else {
            return unreachable_answer("SETCLIENTID", &answer);
        };
        self.compound(&[Op::SetClientIdConfirm { clientid, verifier }])?
            .last("SETCLIENTID_CONFIRM")?;
        self.clientid = Some(clientid);
        Ok(clientid)
    }

    /// Opens `name` in the directory of `dir` for `access` (1 read, 2 write, 3 both),
    /// confirming the open when the server asks; the open's stateid.
    pub fn open(&mut self, dir: &[u8], name: &str, access: u32) -> Result<StateId, NfsError> {
        let clientid = self.establish()?;
        let owner = format!("owner-{}", self.local_port()).into_bytes();
        let seqid = self.open_seqid;
        let ops = [
            Op::PutFh(dir.to_vec()),
            Op::Open {
                seqid,
                access,
                clientid,
                owner,
                name: name.to_owned(),
            },
            Op::GetFh,
        ];
        let reply = self.compound(&ops)?;
        // The open-owner's sequence advances with every OPEN the server ran.
        if reply.results.iter().any(|r| r.op == OP_OPEN) {
            self.open_seqid += 1;
        }
        if !reply.status.is_ok() {
            return Err(NfsError::Status {
                op: "OPEN",
                status: reply.status,
            });
        }
        let Some(Answer::Opened { stateid, confirm }) =
            reply.results.get(1).map(|r| r.answer.clone())
        else {
            return unreachable_answer("OPEN", &Answer::Done);
        };
        if !confirm {
            return Ok(stateid);
        }
        let Some(Answer::Handle(file)) = reply.results.get(2).map(|r| r.answer.clone()) else {
            return unreachable_answer("GETFH", &Answer::Done);
        };
        let seqid = self.open_seqid;
        self.open_seqid += 1;
        match self
            .compound(&[Op::PutFh(file), Op::OpenConfirm { stateid, seqid }])?
            .last("OPEN_CONFIRM")?
        {
            Answer::StateId(stateid) => Ok(stateid),
            other => unreachable_answer("OPEN_CONFIRM", &other),
        }
    }
}

fn unreachable_answer<T>(op: &'static str, answer: &Answer) -> Result<T, NfsError> {
    Err(NfsError::Rpc(RpcError::Malformed(format!(
        "{op}: unexpected answer {answer:?}"
    ))))
}

fn decode_reply(bytes: &[u8]) -> Result<Reply, NfsError> {
    let mut d = Decoder::new(bytes);
    let status = Status(d.u32()?);
    let _tag = d.opaque()?;
    let count = d.u32()?;
    let mut results = Vec::new();
    for _ in 0..count {
        let op = d.u32()?;
        let op_status = Status(d.u32()?);
        let answer = if op_status.is_ok() {
            decode_answer(op, &mut d)?
        } else {
            // SETCLIENTID's CLID_INUSE carries an address; nothing after it is read.
            Answer::Done
        };
        results.push(OpResult {
            op,
            status: op_status,
            answer,
        });
        if !op_status.is_ok() {
            break;
        }
    }
    Ok(Reply { status, results })
}

fn decode_answer(op: u32, d: &mut Decoder<'_>) -> Result<Answer, NfsError> {
    Ok(match op {
        OP_GETFH => Answer::Handle(d.opaque()?.to_vec()),
        OP_GETATTR => Answer::Attrs(decode_attrs(d)?),
        OP_READDIR => {
            let mut verifier = [0; 8];
            verifier.copy_from_slice(d.fixed(8)?);
            let mut names = Vec::new();
            let mut last_cookie = 0;
            while d.bool()? {
                last_cookie = d.u64()?;
                names.push(d.string()?);
                // Attributes: none asked, but skip what came.
                let words = d.u32()?;
                for _ in 0..words {
                    d.u32()?;
                }
                d.opaque()?;
            }
            let eof = d.bool()?;
            Answer::Entries {
                names,
                last_cookie,
                verifier,
                eof,
            }
        }
        OP_READ => {
            let eof = d.bool()?;
            Answer::Data {
                data: d.opaque()?.to_vec(),
                eof,
            }
        }
        OP_WRITE => {
            let count = d.u32()?;
            let _committed = d.u32()?;
            d.fixed(8)?;
            Answer::Written(count)
        }
        OP_SETCLIENTID => {
            let clientid = d.u64()?;
            let mut verifier = [0; 8];
            verifier.copy_from_slice(d.fixed(8)?);
            Answer::ClientId { clientid, verifier }
        }
        OP_OPEN => {
            let stateid = StateId::decode(d)?;
            // change_info4: atomic, before, after.
            d.bool()?;
            d.u64()?;
            d.u64()?;
            let flags = d.u32()?;
            let words = d.u32()?;
            for _ in 0..words {
                d.u32()?;
            }
            skip_delegation(d)?;
            Answer::Opened {
                stateid,
                confirm: flags & OPEN4_RESULT_CONFIRM != 0,
            }
        }
        OP_OPEN_CONFIRM | OP_CLOSE => Answer::StateId(StateId::decode(d)?),
        _ => Answer::Done,
    })
}

fn skip_delegation(d: &mut Decoder<'_>) -> Result<(), Truncated> {
    let kind = d.u32()?;
    if kind == 0 {
        return Ok(());
    }
    StateId::decode(d)?;
    d.bool()?;
    if kind == 2 {
        // space limit: its kind, then by size (u64) or by blocks (two u32): 8 bytes
        // either way.
        d.u32()?;
        d.u64()?;
    }
    // nfsace4: type, flag, mask, who.
    d.u32()?;
    d.u32()?;
    d.u32()?;
    d.opaque()?;
    Ok(())
}

fn decode_attrs(d: &mut Decoder<'_>) -> Result<Attrs, Truncated> {
    let words = d.u32()?;
    let mut mask = Vec::new();
    for _ in 0..words {
        mask.push(d.u32()?);
    }
    let values = d.opaque()?;
    let mut v = Decoder::new(values);
    let word0 = mask.first().copied().unwrap_or(0);
    let has = |bit: u32| word0 & (1 << bit) != 0;
    let mut attrs = Attrs::default();
    // In bit order; only the three asked for can be present.
    if has(ATTR_TYPE) {
        attrs.kind = Some(v.u32()?);
    }
    if has(ATTR_FSID) {
        attrs.fsid = Some((v.u64()?, v.u64()?));
    }
    if has(ATTR_FILEID) {
        attrs.fileid = Some(v.u64()?);
    }
    Ok(attrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compound_stops_at_the_first_failure_and_keeps_its_status() {
        let mut e = Encoder::new();
        e.u32(70).string("t").u32(2);
        e.u32(OP_PUTROOTFH).u32(0);
        e.u32(OP_PUTFH).u32(70);
        let reply = decode_reply(&e.finish()).unwrap();
        assert_eq!(reply.status, Status(70));
        assert_eq!(reply.failure(), Some((1, Status(70))));
        assert_eq!(reply.status.name(), "NFS4ERR_STALE");
    }

    #[test]
    fn readdir_names_and_getfh_handles_are_decoded() {
        let mut e = Encoder::new();
        e.u32(0).string("").u32(3);
        e.u32(OP_PUTROOTFH).u32(0);
        e.u32(OP_GETFH).u32(0).opaque(&[0x43, 0, 0, 7, 1, 9]);
        e.u32(OP_READDIR).u32(0).fixed(&[1; 8]);
        for (cookie, name) in [(3u64, "team-a"), (4, "team-b")] {
            e.bool(true).u64(cookie).string(name).u32(0).opaque(&[]);
        }
        e.bool(false).bool(true);
        let reply = decode_reply(&e.finish()).unwrap();
        assert_eq!(
            reply.results[1].answer,
            Answer::Handle(vec![0x43, 0, 0, 7, 1, 9])
        );
        let Answer::Entries {
            names,
            last_cookie,
            eof,
            ..
        } = &reply.results[2].answer
        else {
            panic!("{:?}", reply.results[2]);
        };
        assert_eq!(names, &["team-a", "team-b"]);
        assert_eq!((*last_cookie, *eof), (4, true));
    }
}
