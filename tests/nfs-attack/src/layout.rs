//! The server side of an attack: a host filesystem holding an export root with three
//! volumes (A and C exported to the attacker, B to another tenant) and a directory
//! outside the export root, the volumes made by the mechanism under test.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::agent_volumes::AgentVolumes;
use crate::filesystems::{FsKind, Mounted, make_image, path_str};
use crate::setup::{Result, SetupError, run};

/// How a volume is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    /// A directory of the host filesystem, exported by itself (no boundary of its own).
    Directories(FsKind),
    /// A filesystem of its own in a sparse image on the (XFS) host, loop-mounted at
    /// the volume's path.
    Images(FsKind),
    /// As `Images`, but B's image is a reflink copy of A's: the same filesystem UUID
    /// unless `new_uuid` gives the copy its own.
    ReflinkClone { kind: FsKind, new_uuid: bool },
    /// A btrfs subvolume of the host, mounted by itself (`subvol=`) at the volume's path.
    BtrfsSubvolumes,
    /// A zfs-fuse dataset of a pool in a file on the (ext4) host, mounted at the
    /// volume's path.
    ZfsDatasets,
    /// Made by the agent's store with quota backend `image` on an XFS host: A and C
    /// created, B a clone of A.
    AgentImages,
}

impl Mechanism {
    pub fn describe(self) -> String {
        match self {
            Mechanism::Directories(kind) => {
                format!("directories of one {} filesystem", kind.name())
            }
            Mechanism::Images(kind) => {
                format!("one {} image per volume, loop-mounted", kind.name())
            }
            Mechanism::ReflinkClone { kind, new_uuid } => format!(
                "{} images, B a reflink copy of A {}",
                kind.name(),
                if new_uuid {
                    "with a new UUID"
                } else {
                    "keeping its UUID"
                }
            ),
            Mechanism::BtrfsSubvolumes => "btrfs subvolumes, each mounted with subvol=".into(),
            Mechanism::ZfsDatasets => "zfs-fuse datasets of one pool".into(),
            Mechanism::AgentImages => {
                "the agent's image volumes, B a clone of A made by the agent".into()
            }
        }
    }

    /// The kind of filesystem A's export lies on.
    pub fn volume_kind(self) -> FsKind {
        match self {
            Mechanism::Directories(kind)
            | Mechanism::Images(kind)
            | Mechanism::ReflinkClone { kind, .. } => kind,
            Mechanism::BtrfsSubvolumes => FsKind::Btrfs,
            Mechanism::ZfsDatasets => FsKind::Zfs,
            Mechanism::AgentImages => FsKind::Ext4,
        }
    }

    fn host_kind(self) -> FsKind {
        match self {
            Mechanism::Directories(kind) => kind,
            // Reflinks, so that an image's copy is instant.
            Mechanism::Images(_) | Mechanism::ReflinkClone { .. } | Mechanism::AgentImages => {
                FsKind::Xfs
            }
            Mechanism::BtrfsSubvolumes => FsKind::Btrfs,
            Mechanism::ZfsDatasets => FsKind::Ext4,
        }
    }
}

/// A volume: its path on the server, its name in the pseudo-filesystem, the one file
/// in it and that file's content.
#[derive(Clone, Debug)]
pub struct Volume {
    pub path: PathBuf,
    pub pseudo: Vec<&'static str>,
    pub file: String,
    pub secret: String,
}

impl Volume {
    pub fn pseudo_path(&self) -> String {
        format!("/{}", self.pseudo.join("/"))
    }

    pub fn file_path(&self) -> PathBuf {
        self.path.join(&self.file)
    }
}

pub struct Layout {
    pub mechanism: Mechanism,
    pub a: Volume,
    pub b: Volume,
    pub c: Volume,
    /// A file outside the export root, on the host filesystem, writable by all.
    pub outside_file: PathBuf,
    /// The path of `outside_file` from the root of the host filesystem.
    pub outside_from_root: Vec<&'static str>,
    /// The path of B's file from the root of the host filesystem.
    pub b_from_root: Vec<String>,
    /// The root of the filesystem A lies on.
    pub a_fs_root: PathBuf,
    // Dropped in this order: volumes, then the host, then the directory holding it.
    _agent_volumes: Option<AgentVolumes>,
    _volumes: Vec<Mounted>,
    _pool: Option<ZfsPool>,
    host: Mounted,
    _dir: tempfile::TempDir,
}

impl Layout {
    pub fn build(mechanism: Mechanism) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let host_image = dir.path().join("host.img");
        let host_kind = mechanism.host_kind();
        let host_size = match mechanism {
            Mechanism::Directories(_) | Mechanism::BtrfsSubvolumes => 512,
            _ => 4096,
        };
        make_image(&host_image, host_kind, host_size)?;
        let host = Mounted::loop_image(&host_image, &dir.path().join("host"), &[])?;
        let root = host.path().to_owned();
        let outside = root.join("outside");
        std::fs::create_dir(&outside)?;
        let outside_file = outside.join("authorized_keys");
        write_world_writable(&outside_file, "ssh-ed25519 outside-the-export-root\n")?;
        let volume = |ns: &'static str, name: &'static str| Volume {
            path: root.join("exports").join(ns).join(name),
            pseudo: vec![ns, name],
            file: format!("{name}.txt"),
            secret: format!("secret of {ns}/{name}\n"),
        };
        let (a, b, c) = (
            volume("team-a", "app"),
            volume("team-b", "db"),
            volume("team-c", "old"),
        );
        for v in [&a, &b, &c] {
            std::fs::create_dir_all(v.path.parent().unwrap_or(&root))?;
        }
        let mut volumes = Vec::new();
        let mut pool = None;
        let mut agent_volumes = None;
        let images = root.join("images");
        match mechanism {
            Mechanism::Directories(_) => {
                for v in [&a, &b, &c] {
                    std::fs::create_dir(&v.path)?;
                }
            }
            Mechanism::Images(kind) => {
                std::fs::create_dir(&images)?;
                for (n, v) in [&a, &b, &c].into_iter().enumerate() {
                    let image = images.join(format!("{n}.img"));
                    make_image(&image, kind, kind.min_mib().max(64))?;
                    volumes.push(Mounted::loop_image(&image, &v.path, &[])?);
                }
            }
            Mechanism::ReflinkClone { kind, new_uuid } => {
                std::fs::create_dir(&images)?;
                let size = kind.min_mib().max(64);
                let (image_a, image_b, image_c) = (
                    images.join("a.img"),
                    images.join("b.img"),
                    images.join("c.img"),
                );
                make_image(&image_a, kind, size)?;
                make_image(&image_c, kind, size)?;
                {
                    // Something in A before the copy, so that the copy shares extents.
                    let a_mount = Mounted::loop_image(&image_a, &a.path, &[])?;
                    write_world_writable(&a_mount.path().join("from-before-the-copy"), "a\n")?;
                }
                run(
                    "cp",
                    &["--reflink=always", path_str(&image_a)?, path_str(&image_b)?],
                )?;
                let mut b_options: Vec<&str> = Vec::new();
                if new_uuid {
                    give_new_uuid(&image_b, kind)?;
                } else if kind == FsKind::Xfs {
                    // XFS refuses to mount a second filesystem with a UUID already mounted.
                    b_options.push("nouuid");
                }
                volumes.push(Mounted::loop_image(&image_a, &a.path, &[])?);
                volumes.push(Mounted::loop_image(&image_b, &b.path, &b_options)?);
                volumes.push(Mounted::loop_image(&image_c, &c.path, &[])?);
            }
            Mechanism::BtrfsSubvolumes => {
                let subvolumes = root.join("subvolumes");
                std::fs::create_dir(&subvolumes)?;
                let device = host.device()?;
                for (n, v) in [&a, &b, &c].into_iter().enumerate() {
                    let subvolume = subvolumes.join(n.to_string());
                    run(
                        "btrfs",
                        &["-q", "subvolume", "create", path_str(&subvolume)?],
                    )?;
                    volumes.push(Mounted::mount(
                        &device,
                        &v.path,
                        &format!("subvol=subvolumes/{n}"),
                    )?);
                }
            }
            Mechanism::AgentImages => {
                let path = |v: &Volume| v.pseudo.join("/");
                agent_volumes = Some(AgentVolumes::make(
                    &root.join("exports"),
                    &path(&a),
                    &path(&b),
                    &path(&c),
                )?);
            }
            Mechanism::ZfsDatasets => {
                let made = ZfsPool::create(&root.join("pool.img"))?;
                for (n, v) in [&a, &b, &c].into_iter().enumerate() {
                    run(
                        "zfs",
                        &[
                            "create",
                            "-o",
                            &format!("mountpoint={}", path_str(&v.path)?),
                            &format!("{}/v{n}", made.name),
                        ],
                    )?;
                }
                pool = Some(made);
            }
        }
        for v in [&a, &b, &c] {
            std::fs::set_permissions(&v.path, std::fs::Permissions::from_mode(0o777))?;
            write_world_writable(&v.file_path(), &v.secret)?;
        }
        let a_fs_root = match mechanism {
            // btrfs: the top-level subvolume, whose handle is as easily guessed.
            Mechanism::Directories(_) | Mechanism::BtrfsSubvolumes => root.clone(),
            _ => a.path.clone(),
        };
        let b_dir: &[&str] = match mechanism {
            Mechanism::BtrfsSubvolumes => &["subvolumes", "1"],
            _ => &["exports", "team-b", "db"],
        };
        let b_from_root = b_dir
            .iter()
            .map(|c| (*c).to_owned())
            .chain([b.file.clone()])
            .collect();
        Ok(Self {
            mechanism,
            a,
            b,
            c,
            outside_file,
            outside_from_root: vec!["outside", "authorized_keys"],
            b_from_root,
            a_fs_root,
            _agent_volumes: agent_volumes,
            _volumes: volumes,
            _pool: pool,
            host,
            _dir: dir,
        })
    }

    pub fn host_root(&self) -> &Path {
        self.host.path()
    }

    /// The UUID blkid reads from the device of the filesystem `path` is the root of,
    /// or what went wrong.
    pub fn uuid_of(path: &Path) -> String {
        let device = run(
            "findmnt",
            &[
                "-n",
                "-o",
                "SOURCE",
                "--target",
                path.to_str().unwrap_or_default(),
            ],
        );
        match device {
            Ok(device) => {
                let device = device
                    .trim()
                    .split('[')
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                run("blkid", &["-p", "-o", "value", "-s", "UUID", &device])
                    .map(|uuid| format!("{device}: {}", uuid.trim()))
                    .unwrap_or_else(|e| e.to_string())
            }
            Err(e) => e.to_string(),
        }
    }

    /// How many of the volumes are filesystems mounted on the host (0: directories of
    /// the host).
    pub fn volume_mounts(&self) -> usize {
        use std::os::unix::fs::MetadataExt;
        let host = std::fs::metadata(self.host_root()).map(|m| m.dev()).ok();
        [&self.a, &self.b, &self.c]
            .iter()
            .filter(|v| std::fs::metadata(&v.path).is_ok_and(|m| Some(m.dev()) != host))
            .count()
    }
}

/// A zfs-fuse pool in a file, its daemon started if none answers (and left running),
/// one pool at a time on the machine (zfs-fuse wedges with several); destroyed when
/// dropped.
struct ZfsPool {
    name: String,
    _turn: std::fs::File,
}

impl ZfsPool {
    fn create(file: &Path) -> Result<Self> {
        let turn = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(std::env::temp_dir().join("nfsprov-zfs-tests.lock"))?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
        while let Err(e) = turn.try_lock() {
            if std::time::Instant::now() >= deadline {
                return Err(SetupError::Failed(format!("no turn at a ZFS pool: {e}")));
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        if run("zpool", &["list"]).is_err() {
            run("zfs-fuse", &[])?;
            crate::setup::eventually(
                "zfs-fuse to answer",
                std::time::Duration::from_secs(30),
                || run("zpool", &["list"]).is_ok(),
            )?;
        }
        std::fs::File::create(file)?.set_len(256 << 20)?;
        let name = format!("nfsprovattack{}", std::process::id());
        run("zpool", &["create", "-m", "none", &name, path_str(file)?])?;
        Ok(Self { name, _turn: turn })
    }
}

impl Drop for ZfsPool {
    fn drop(&mut self) {
        if let Err(e) = run("zpool", &["destroy", "-f", &self.name]) {
            eprintln!("could not destroy pool {}: {e}", self.name);
        }
    }
}

fn give_new_uuid(image: &Path, kind: FsKind) -> Result<()> {
    let image = path_str(image)?;
    match kind {
        FsKind::Ext4 => {
            // Instant, without a check first: the image has metadata_csum_seed.
            run("tune2fs", &["-U", "random", image])?;
        }
        FsKind::Xfs => {
            run("xfs_admin", &["-U", "generate", image])?;
        }
        FsKind::Btrfs | FsKind::Zfs => {
            return Err(SetupError::Failed(
                "only ext4 and XFS images are cloned here".into(),
            ));
        }
    }
    Ok(())
}

fn write_world_writable(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(())
}
