use std::path::Path;

use super::ffi::{RawDirentPrefix, RawStat64, RawUrl, load};
use super::fixture::*;
use super::*;
use crate::nfs::NfsServer;
use std::os::unix::fs::MetadataExt;

/// Why this machine cannot run a real server and libnfs, if it cannot.
fn missing_prerequisite() -> Option<String> {
    let on_path = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| dir.join("ganesha.nfsd").is_file())
    });
    if !on_path {
        return Some("ganesha.nfsd not installed (Debian: nfs-ganesha, nfs-ganesha-vfs)".into());
    }
    let vfs = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .any(|dir| dir.path().join("ganesha/libfsalvfs.so").exists());
    if !vfs {
        return Some("ganesha's VFS backend not installed (Debian: nfs-ganesha-vfs)".into());
    }
    if !rustix::process::geteuid().is_root() {
        return Some("ganesha exporting with real owners needs root".into());
    }
    available().err()
}

struct Setup {
    // Dropped first: the server outlives nothing that talks to it.
    client: NfsClient,
    nfs: NfsServer,
    root: std::path::PathBuf,
    _base: tempfile::TempDir,
}

async fn setup(test: &str) -> anyhow::Result<Option<Setup>> {
    if let Some(reason) = missing_prerequisite() {
        nfsprov_test_skip::skip(test, &reason);
        return Ok(None);
    }
    let base = tempfile::tempdir()?;
    let root = base.path().join("export");
    std::fs::create_dir(&root)?;
    let nfs = NfsServer::start(&[&root]).await?;
    let export = root.to_str().expect("a UTF-8 temp path").to_owned();
    let client = NfsClient::connect("127.0.0.1", nfs.port(), &export)
        .map_err(|e| anyhow::anyhow!("{e:#}; ganesha log:\n{}", nfs.log_text()))?;
    Ok(Some(Setup {
        client,
        nfs,
        root,
        _base: base,
    }))
}

#[test]
fn a_missing_library_is_named_with_its_package() {
    let error = load("libnfs.so.0.does-not-exist")
        .err()
        .expect("no such library");
    assert!(
        error.starts_with("libnfs.so.0.does-not-exist not found: install libnfs13 (Debian"),
        "{error}"
    );
}

#[test]
fn the_transcribed_layouts_have_libnfs_4_sizes() {
    // Seventeen uint64_t; the dirent prefix is three 8-byte fields on LP64.
    assert_eq!(std::mem::size_of::<RawStat64>(), 17 * 8);
    assert_eq!(std::mem::offset_of!(RawStat64, nfs_used), 16 * 8);
    assert_eq!(std::mem::offset_of!(RawDirentPrefix, inode), 16);
    assert_eq!(std::mem::size_of::<RawUrl>(), 3 * 8);
}

#[tokio::test(flavor = "multi_thread")]
async fn libnfs_fixture_tree_is_real_on_the_server_and_reads_back() -> anyhow::Result<()> {
    let test = "libnfs_fixture_tree_is_real_on_the_server_and_reads_back";
    // Kept whole: its fields drop in order, the client before the server.
    let Some(setup) = setup(test).await? else {
        return Ok(());
    };
    let (client, nfs, root) = (&setup.client, &setup.nfs, &setup.root);
    client.mkdir("vol", 0o770)?;
    write_fixture_tree(client, "/vol")
        .map_err(|e| anyhow::anyhow!("{e:#}; ganesha log:\n{}", nfs.log_text()))?;
    let on_disk = root.join("vol");
    let meta = |name: &str| std::fs::symlink_metadata(on_disk.join(name)).unwrap();

    // Owners and modes, as the server's filesystem has them.
    let owner_mode = |name: &str| {
        let m = meta(name);
        (m.uid(), m.gid(), m.mode() & 0o7777)
    };
    assert_eq!(owner_mode(OWNER_A), (1001, 1001, 0o640));
    assert_eq!(owner_mode(OWNER_B), (2002, 3003, 0o755));
    assert_eq!(owner_mode(SECRET), (1001, 1001, 0o600));
    assert_eq!(owner_mode(EMPTY), (2002, 3003, 0o644));
    assert_eq!(owner_mode(NESTED), (1001, 1001, 0o644));
    assert_eq!(owner_mode(SPARSE), (1001, 1001, 0o644));
    assert_eq!(owner_mode(SUBDIR), (1001, 1001, 0o750));
    assert!(meta(SUBDIR).is_dir());
    assert_eq!(
        std::fs::read(on_disk.join(OWNER_A))?,
        b"owned by 1001, mode 0640\n"
    );
    assert_eq!(meta(EMPTY).len(), 0);

    // One inode, two names.
    assert_eq!(meta(HARD_LINK).ino(), meta(HARD_LINK_2).ino());
    assert_eq!(meta(HARD_LINK).nlink(), 2);
    assert_eq!(
        (meta(HARD_LINK_2).uid(), meta(HARD_LINK_2).gid()),
        (2002, 3003)
    );

    // A relative symlink, itself owned by 1001, resolving to owner-a.txt.
    assert!(meta(SYMLINK).file_type().is_symlink());
    assert_eq!(
        std::fs::read_link(on_disk.join(SYMLINK))?,
        Path::new(SYMLINK_TARGET)
    );
    assert_eq!((meta(SYMLINK).uid(), meta(SYMLINK).gid()), (1001, 1001));
    assert_eq!(
        std::fs::read(on_disk.join(SYMLINK))?,
        std::fs::read(on_disk.join(OWNER_A))?
    );

    // 64 MiB apparent, two 4 KiB extents allocated (a filesystem may round up a bit).
    let sparse = meta(SPARSE);
    assert_eq!(sparse.len(), SPARSE_SIZE);
    assert!(
        sparse.blocks() * 512 <= 1 << 20,
        "the sparse file occupies {} bytes on the server",
        sparse.blocks() * 512
    );
    let bytes = std::fs::read(on_disk.join(SPARSE))?;
    for (i, offset) in SPARSE_EXTENTS.iter().enumerate() {
        let at = *offset as usize;
        assert_eq!(&bytes[at..at + EXTENT_LEN], extent_bytes(i).as_slice());
    }
    assert_eq!(bytes.iter().filter(|b| **b != 0).count(), 2 * EXTENT_LEN);

    // Through NFS, the same tree: every attribute as the server's filesystem says.
    let over_nfs = snapshot_tree(client, "vol")?;
    let server_side = snapshot_local_tree(&on_disk)?;
    assert_eq!(over_nfs, server_side);
    let mut names: Vec<&str> = over_nfs.entries.keys().map(String::as_str).collect();
    names.sort();
    let mut expected = NAMES.to_vec();
    expected.sort();
    assert_eq!(names, expected);
    assert_eq!(
        over_nfs.hard_links,
        vec![vec![HARD_LINK.to_owned(), HARD_LINK_2.to_owned()]]
    );
    assert_eq!(
        over_nfs.entries[SPARSE].content,
        Some(Content::Digest {
            len: SPARSE_SIZE,
            fnv1a: match Content::of(&bytes) {
                Content::Digest { fnv1a, .. } => fnv1a,
                Content::Text(_) => unreachable!(),
            },
            nonzero_blocks: SPARSE_EXTENTS.to_vec(),
        })
    );
    assert_eq!(over_nfs.entries[SPARSE].has_holes, Some(true));

    // lstat over NFS agrees with the server's own, field by field.
    for name in NAMES {
        let remote = client.lstat(&format!("vol/{name}"))?;
        let local = local_stat(&on_disk.join(name))?;
        assert_eq!(
            (
                remote.kind,
                remote.raw_mode,
                remote.uid,
                remote.gid,
                remote.nlink,
                remote.ino
            ),
            (
                local.kind,
                local.raw_mode,
                local.uid,
                local.gid,
                local.nlink,
                local.ino
            ),
            "{name}"
        );
        if remote.kind != FileKind::Directory {
            assert_eq!(remote.size, local.size, "{name}");
        }
        assert_eq!(remote.mtime, local.mtime, "{name}");
    }
    let (apparent, used) = sparse_usage(client, "vol")?;
    assert_eq!(apparent, SPARSE_SIZE);
    assert_eq!(
        used,
        sparse.blocks() * 512,
        "space_used is the server's st_blocks"
    );
    assert!(used < SPARSE_SIZE / 16);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn libnfs_identities_times_ranges_and_errors() -> anyhow::Result<()> {
    let test = "libnfs_identities_times_ranges_and_errors";
    let Some(setup) = setup(test).await? else {
        return Ok(());
    };
    let (client, root) = (&setup.client, &setup.root);
    client.mkdir("shared", 0o777)?;
    assert_eq!(
        std::fs::metadata(root.join("shared"))?.mode() & 0o7777,
        0o777,
        "no umask applies"
    );

    // A user's files are theirs, with the mode they asked for.
    let user = client.as_user(1001, 1001)?;
    assert_eq!(user.identity(), (1001, 1001));
    user.write_file("shared/mine", b"first version, longer", 0o640)?;
    user.write_file("shared/mine", b"second", 0o604)?;
    let on_disk = std::fs::metadata(root.join("shared/mine"))?;
    assert_eq!(
        (on_disk.uid(), on_disk.gid(), on_disk.mode() & 0o7777),
        (1001, 1001, 0o604)
    );
    assert_eq!(std::fs::read(root.join("shared/mine"))?, b"second");
    user.mkdir("shared/user-dir", 0o700)?;
    let dir_meta = std::fs::metadata(root.join("shared/user-dir"))?;
    assert_eq!((dir_meta.uid(), dir_meta.mode() & 0o7777), (1001, 0o700));

    // The server checks permissions against the identity: errno comes back.
    let stranger = client.as_user(2002, 3003)?;
    let denied = stranger
        .write_file("shared/user-dir/intruder", b"x", 0o644)
        .expect_err("0700 directory of another user");
    let errno = denied.downcast_ref::<NfsError>().map(|e| e.errno);
    assert_eq!(errno, Some(libc::EACCES), "{denied:#}");
    let refused = user
        .chown("shared/mine", 2002, 3003)
        .expect_err("only root gives files away");
    assert_eq!(
        refused.downcast_ref::<NfsError>().map(|e| e.errno),
        Some(libc::EPERM),
        "{refused:#}"
    );
    let missing = client
        .lstat("shared/nothing-here")
        .expect_err("no such file");
    assert_eq!(
        missing.downcast_ref::<NfsError>().map(|e| e.errno),
        Some(libc::ENOENT),
        "{missing:#}"
    );

    // Ranges and a large file crossing many read and write chunks.
    let big: Vec<u8> = (0..(1 << 20) + 123).map(|i: u32| (i % 251) as u8).collect();
    client.write_file("shared/big", &big, 0o644)?;
    assert_eq!(std::fs::read(root.join("shared/big"))?, big);
    assert_eq!(client.read_file("shared/big")?, big);
    assert_eq!(
        client.read_range("shared/big", 700_001, 10)?,
        big[700_001..700_011]
    );
    assert_eq!(
        client.read_range("shared/big", big.len() as u64 - 3, 100)?,
        big[big.len() - 3..]
    );
    client.write_at("shared/big", 7, b"XYZ")?;
    assert_eq!(
        client.read_range("shared/big", 6, 5)?,
        [big[6], b'X', b'Y', b'Z', big[10]]
    );
    client.truncate("shared/big", 4)?;
    assert_eq!(std::fs::read(root.join("shared/big"))?, big[..4]);

    // Times: set, seen on the server and read back through NFS with nanoseconds.
    let atime = Timestamp {
        sec: 1_600_000_000,
        nsec: 0,
    };
    let mtime = Timestamp {
        sec: 1_500_000_000,
        nsec: 250_000_000,
    };
    client.set_times("shared/mine", atime, mtime)?;
    let on_disk = std::fs::metadata(root.join("shared/mine"))?;
    assert_eq!(
        (on_disk.mtime(), on_disk.mtime_nsec()),
        (1_500_000_000, 250_000_000)
    );
    assert_eq!(on_disk.atime(), 1_600_000_000);
    let stat = client.lstat("shared/mine")?;
    assert_eq!((stat.mtime, stat.atime), (mtime, atime));

    // stat follows a symlink, lstat does not; lchmod of a file.
    client.symlink("mine", "shared/link")?;
    assert_eq!(client.readlink("shared/link")?, "mine");
    assert_eq!(client.lstat("shared/link")?.kind, FileKind::Symlink);
    assert_eq!(client.lstat("shared/link")?.size, 4);
    let followed = client.stat("shared/link")?;
    assert_eq!(
        (followed.kind, followed.uid, followed.size),
        (FileKind::File, 1001, 6)
    );
    client
        .lchmod("shared/renamed-later", 0o640)
        .expect_err("no such file");
    client.write_file("shared/plain", b"", 0o600)?;
    client.lchmod("shared/plain", 0o664)?;
    assert_eq!(
        std::fs::metadata(root.join("shared/plain"))?.mode() & 0o7777,
        0o664
    );

    // What libnfs 4.0 over NFSv4 gets wrong is refused before it happens: attributes
    // of a directory, and l-variants on a symlink (they would change its target).
    let unsupported = |result: anyhow::Result<()>| {
        let error = result.expect_err("refused");
        assert_eq!(
            error.downcast_ref::<NfsError>().map(|e| e.errno),
            Some(libc::EOPNOTSUPP),
            "{error:#}"
        );
    };
    unsupported(client.chmod("shared/user-dir", 0o755));
    unsupported(client.chown("shared/user-dir", 0, 0));
    unsupported(client.set_times("shared/user-dir", atime, mtime));
    unsupported(client.lchown("shared/link", 0, 0));
    unsupported(client.lchmod("shared/link", 0o600));
    let target = std::fs::metadata(root.join("shared/mine"))?;
    assert_eq!((target.uid(), target.mode() & 0o7777), (1001, 0o604));
    // Owned directories and symlinks are made by their owners instead.
    client.mkdir_owned("shared/owned-dir", 0o1751, 2002, 3003)?;
    let owned = std::fs::metadata(root.join("shared/owned-dir"))?;
    assert_eq!(
        (owned.uid(), owned.gid(), owned.mode() & 0o7777),
        (2002, 3003, 0o1751)
    );
    client.symlink_owned("../elsewhere", "shared/owned-dir/link", 1001, 1001)?;
    let link = std::fs::symlink_metadata(root.join("shared/owned-dir/link"))?;
    assert!(link.file_type().is_symlink());
    assert_eq!((link.uid(), link.gid()), (1001, 1001));
    assert_eq!(
        std::fs::read_link(root.join("shared/owned-dir/link"))?,
        Path::new("../elsewhere")
    );
    let leftovers: Vec<_> = std::fs::read_dir(root)?
        .map(|e| e.unwrap().file_name())
        .filter(|name| name.to_string_lossy().starts_with(".nfsprov-e2e-staging"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // Listings carry the server's names; lstat its inode numbers.
    let listed = client.read_dir("shared")?;
    let mut expected: Vec<String> = std::fs::read_dir(root.join("shared"))?
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    expected.sort();
    assert_eq!(listed, expected);
    for name in &listed {
        assert_eq!(
            client.lstat(&format!("shared/{name}"))?.ino,
            std::fs::symlink_metadata(root.join("shared").join(name))?.ino(),
            "{name}"
        );
    }

    // Rename, unlink, rmdir, and what the server sees of them.
    client.rename("shared/mine", "shared/renamed")?;
    assert!(root.join("shared/renamed").exists() && !root.join("shared/mine").exists());
    client.unlink("shared/renamed")?;
    client.unlink("shared/link")?;
    client.unlink("shared/plain")?;
    client.unlink("shared/big")?;
    client.rmdir("shared/user-dir")?;
    assert!(!root.join("shared/user-dir").exists());
    client.unlink("shared/owned-dir/link")?;
    client.rmdir("shared/owned-dir")?;
    assert_eq!(client.read_dir("shared")?, Vec::<String>::new());
    Ok(())
}
