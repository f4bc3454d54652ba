//! The server side of an attack: an export root with three volumes (A and C exported to
//! the attacker, B to another tenant) and, beside it on the filesystem that holds it, a
//! directory outside the export root, the volumes made by the mechanism under test.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nfsprov_agent_testkit::{PoolError, ZfsPool};

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
    /// A zfs-fuse dataset of a pool in a file, mounted at the volume's path on the
    /// (ext4) host.
    ZfsDatasets,
    /// Made by the agent's store with quota backend `image` on an XFS host: A and C
    /// created, B a clone of A.
    AgentImages,
    /// Made by the agent's store with quota backend `zfs`: A and C created, B a clone
    /// of A, each a dataset of a zfs-fuse pool below the dataset mounted at the export
    /// root; the file outside the export root lies on the pool's own dataset.
    AgentZfs,
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
            Mechanism::AgentZfs => {
                "the agent's zfs datasets, B a clone of A made by the agent".into()
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
            Mechanism::ZfsDatasets | Mechanism::AgentZfs => FsKind::Zfs,
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
            Mechanism::ZfsDatasets | Mechanism::AgentZfs => FsKind::Ext4,
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
    /// A file outside the export root, on the filesystem holding the export root (the
    /// host's, or for `AgentZfs` the pool's own dataset), writable by all.
    pub outside_file: PathBuf,
    /// The path of `outside_file` from the root of its filesystem.
    pub outside_from_root: Vec<&'static str>,
    /// The path of B's file from the root of the filesystem holding the export root.
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
            Mechanism::Directories(_)
            | Mechanism::BtrfsSubvolumes
            | Mechanism::ZfsDatasets
            | Mechanism::AgentZfs => 512,
            _ => 4096,
        };
        make_image(&host_image, host_kind, host_size)?;
        let host = Mounted::loop_image(&host_image, &dir.path().join("host"), &[])?;
        let root = host.path().to_owned();
        // After the host: dropped on an error before it, so that no dataset is left
        // mounted on the host as it is unmounted.
        let pool = match mechanism {
            Mechanism::ZfsDatasets | Mechanism::AgentZfs => Some(zfs_pool()?),
            _ => None,
        };
        // The export root, and the root of the filesystem holding it.
        let (exports, beside) = match (mechanism, &pool) {
            (Mechanism::AgentZfs, Some(pool)) => {
                (pool.export_root().to_owned(), pool.pool_mount().to_owned())
            }
            _ => (root.join("exports"), root.clone()),
        };
        let outside = beside.join("outside");
        std::fs::create_dir(&outside)?;
        let outside_file = outside.join("authorized_keys");
        write_world_writable(&outside_file, "ssh-ed25519 outside-the-export-root\n")?;
        let volume = |ns: &'static str, name: &'static str| Volume {
            path: exports.join(ns).join(name),
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
            Mechanism::AgentImages | Mechanism::AgentZfs => {
                let settings = match &pool {
                    Some(pool) => pool.quota_settings(),
                    None => AgentVolumes::image_settings(),
                };
                let path = |v: &Volume| v.pseudo.join("/");
                agent_volumes = Some(AgentVolumes::make(
                    &settings,
                    &exports,
                    &path(&a),
                    &path(&b),
                    &path(&c),
                )?);
            }
            Mechanism::ZfsDatasets => {
                let dataset = pool.as_ref().map(ZfsPool::dataset).unwrap_or_default();
                for (n, v) in [&a, &b, &c].into_iter().enumerate() {
                    run(
                        "zfs",
                        &[
                            "create",
                            "-o",
                            &format!("mountpoint={}", path_str(&v.path)?),
                            &format!("{dataset}/v{n}"),
                        ],
                    )?;
                }
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
            // The export root is the root of its dataset.
            Mechanism::AgentZfs => &["team-b", "db"],
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

    /// How many of the volumes are filesystems of their own: each on a device that
    /// neither the directory it is in nor an earlier volume is on (0: directories).
    pub fn volume_mounts(&self) -> usize {
        use std::os::unix::fs::MetadataExt;
        let device = |path: &Path| std::fs::metadata(path).map(|m| m.dev()).ok();
        let mut seen = Vec::new();
        [&self.a, &self.b, &self.c]
            .iter()
            .filter(|v| {
                let own = device(&v.path);
                let parent = v.path.parent().and_then(device);
                let apart = own.is_some() && own != parent && !seen.contains(&own);
                seen.push(own);
                apart
            })
            .count()
    }
}

/// Sparse, so only what is written takes disk space; ZFS wants at least 64 MiB.
const POOL_BYTES: u64 = 256 << 20;

/// A zfs-fuse pool in a file, once the machine's turn at one has come (the agent's ZFS
/// tests take the same turns: zfs-fuse wedges with several pools at once), its daemon
/// started if none answers; destroyed when dropped.
fn zfs_pool() -> Result<ZfsPool> {
    ZfsPool::create(POOL_BYTES).map_err(|e| match e {
        PoolError::Unavailable(reason) => SetupError::Unavailable(reason),
        PoolError::Failed(reason) => SetupError::Failed(format!("a ZFS pool: {reason}")),
    })
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
