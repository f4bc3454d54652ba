//! NFS clients that reach the server from a loopback address of their own (127.0.0.2,
//! 127.0.0.3, ...), so one machine can play several nodes an export admits or refuses.
//! libnfs can only pick an interface, so the libnfs-utils tools run with a small
//! LD_PRELOAD library, built here from C, whose `bind()` and `connect()` put the
//! socket on the address `NFSPROV_SOURCE_ADDRESS` names.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const SHIM_SOURCE: &str = r#"
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* The address the environment names, or 0 when it names none. */
static int source_address(struct in_addr *out) {
    const char *text = getenv("NFSPROV_SOURCE_ADDRESS");
    return text != NULL && inet_pton(AF_INET, text, out) == 1;
}

/* A bind to any address (libnfs binds a reserved port that way as root) gets the
   source address instead, its port kept. */
int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real_bind)(int, const struct sockaddr *, socklen_t);
    if (real_bind == NULL) real_bind = dlsym(RTLD_NEXT, "bind");
    struct in_addr source;
    if (addr != NULL && addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)
        && source_address(&source)) {
        struct sockaddr_in local;
        memcpy(&local, addr, sizeof local);
        if (local.sin_addr.s_addr == htonl(INADDR_ANY)) local.sin_addr = source;
        return real_bind(fd, (const struct sockaddr *)&local, sizeof local);
    }
    return real_bind(fd, addr, len);
}

/* A socket not bound yet is bound to the source address before it connects. */
int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real_connect)(int, const struct sockaddr *, socklen_t);
    if (real_connect == NULL) real_connect = dlsym(RTLD_NEXT, "connect");
    struct in_addr source;
    if (addr != NULL && addr->sa_family == AF_INET && source_address(&source)) {
        struct sockaddr_in bound;
        socklen_t bound_len = sizeof bound;
        if (getsockname(fd, (struct sockaddr *)&bound, &bound_len) == 0
            && bound.sin_family == AF_INET && bound.sin_port == 0) {
            struct sockaddr_in local;
            memset(&local, 0, sizeof local);
            local.sin_family = AF_INET;
            local.sin_addr = source;
            if (bind(fd, (const struct sockaddr *)&local, sizeof local) != 0) return -1;
        }
    }
    return real_connect(fd, addr, len);
}
"#;

/// The compiled shim; its directory is removed when dropped.
pub struct BindShim {
    library: PathBuf,
    _dir: tempfile::TempDir,
}

impl BindShim {
    /// Compiles the shim with the system's C compiler (`cc`).
    pub fn build() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let source = dir.path().join("bind_shim.c");
        let library = dir.path().join("libbind_shim.so");
        std::fs::write(&source, SHIM_SOURCE)?;
        let output = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-Wall", "-o"])
            .arg(&library)
            .arg(&source)
            .arg("-ldl")
            .output()
            .map_err(|e| anyhow::anyhow!("cannot run cc (Debian: gcc): {e}"))?;
        anyhow::ensure!(
            output.status.success(),
            "cc failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(Self { library, _dir: dir })
    }

    pub fn library(&self) -> &Path {
        &self.library
    }

    /// A client on `address`.
    pub fn node(&self, address: Ipv4Addr) -> NodeClient<'_> {
        NodeClient {
            shim: self,
            address,
        }
    }
}

/// The libnfs-utils tools run from one loopback address.
pub struct NodeClient<'a> {
    shim: &'a BindShim,
    address: Ipv4Addr,
}

impl NodeClient<'_> {
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command
            .env("LD_PRELOAD", self.shim.library())
            .env("NFSPROV_SOURCE_ADDRESS", self.address.to_string())
            .stdin(Stdio::null());
        command
    }

    fn run(&self, mut command: Command) -> anyhow::Result<Vec<u8>> {
        let output = command.output()?;
        anyhow::ensure!(
            output.status.success(),
            "{:?} from {} failed ({}): {}",
            command.get_args().collect::<Vec<_>>(),
            self.address,
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Ok(output.stdout)
    }

    /// Lists a directory (`nfs-ls`).
    pub fn ls(&self, url: &str) -> anyhow::Result<String> {
        let mut command = self.command("nfs-ls");
        command.arg(url);
        self.run(command)
            .map(|out| String::from_utf8_lossy(&out).into_owned())
    }

    /// Writes a file as `uid`/`gid` (root when `None`) with `nfs-cp`.
    pub fn write(
        &self,
        url: &str,
        contents: &[u8],
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> anyhow::Result<()> {
        let staged = tempfile::NamedTempFile::new()?;
        std::fs::write(staged.path(), contents)?;
        let mut url = url.to_owned();
        if let Some(uid) = uid {
            let _ = write!(url, "&uid={uid}");
        }
        if let Some(gid) = gid {
            let _ = write!(url, "&gid={gid}");
        }
        let mut command = self.command("nfs-cp");
        command.arg(staged.path()).arg(url);
        self.run(command).map(drop)
    }
}
