//! Image volumes (quota backend `image`) as a copy of the disk holds them: each volume,
//! archive and snapshot an ext4 filesystem in an image file in the agent's area
//! (`.nfsprov/images/`), a volume's record a `.json` beside its image. The layout is
//! spelled out here rather than taken from the agent, so that the copy is read as it
//! is. An image's files are read through a read-only mount of the image itself, and a
//! volume the agent serves must be mounted from its own image in the copy.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};

/// The image area beneath the export root, and its parts.
const AREA: &str = ".nfsprov/images";
const ARCHIVES: &str = ".archive";
const SNAPSHOTS: &str = ".snapshots";
const FREEZING: &str = ".freezing";
const IMAGE: &str = ".img";
const RECORD: &str = ".json";

/// The image area of the export root `root` (a copy's, as mounted).
pub struct ImageArea {
    dir: PathBuf,
}

/// What the area holds, by key (the path below the area without the suffix).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct AreaContents {
    /// Volumes: images and records outside the archive, snapshot and freeze areas.
    pub volume_images: BTreeSet<String>,
    pub volume_records: BTreeSet<String>,
    /// Archives, by the archive path the API answers (`.archive/<path>/@<time>`).
    pub archive_images: BTreeSet<String>,
    pub archive_records: BTreeSet<String>,
    /// Snapshots, by name.
    pub snapshot_images: BTreeSet<String>,
}

impl ImageArea {
    pub fn new(root: &Path) -> Self {
        Self {
            dir: root.join(AREA),
        }
    }

    /// The image of the volume or archive `key`.
    pub fn image(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}{IMAGE}"))
    }

    pub fn record(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}{RECORD}"))
    }

    pub fn snapshot(&self, name: &str) -> PathBuf {
        self.dir.join(SNAPSHOTS).join(format!("{name}{IMAGE}"))
    }

    /// Every image and record in the area (files being written aside, `.tmp`, are
    /// neither).
    pub fn contents(&self) -> anyhow::Result<AreaContents> {
        let mut contents = AreaContents::default();
        let mut pending = vec![String::new()];
        while let Some(rel) = pending.pop() {
            let dir = self.dir.join(&rel);
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e).with_context(|| format!("list {}", dir.display())),
            };
            for entry in entries {
                let entry = entry?;
                let name = entry.file_name().to_string_lossy().into_owned();
                let key = if rel.is_empty() {
                    name
                } else {
                    format!("{rel}/{name}")
                };
                if entry.file_type()?.is_dir() {
                    if key != FREEZING {
                        pending.push(key);
                    }
                    continue;
                }
                let (set, key) = if let Some(key) = key.strip_suffix(IMAGE) {
                    if let Some(name) = key.strip_prefix(&format!("{SNAPSHOTS}/")) {
                        (&mut contents.snapshot_images, name)
                    } else if key.starts_with(&format!("{ARCHIVES}/")) {
                        (&mut contents.archive_images, key)
                    } else {
                        (&mut contents.volume_images, key)
                    }
                } else if let Some(key) = key.strip_suffix(RECORD) {
                    if key.starts_with(&format!("{ARCHIVES}/")) {
                        (&mut contents.archive_records, key)
                    } else {
                        (&mut contents.volume_records, key)
                    }
                } else {
                    continue;
                };
                set.insert(key.to_owned());
            }
        }
        Ok(contents)
    }

    /// What is wrong with the area once the agent has started on the copy and purged
    /// what a crash left: every volume, archive and snapshot the agent lists has its
    /// image (and volumes and archives their record), and nothing else is there.
    pub fn differences(
        &self,
        volumes: &BTreeSet<String>,
        archives: &BTreeSet<String>,
        snapshots: &BTreeSet<String>,
    ) -> anyhow::Result<Vec<String>> {
        let found = self.contents()?;
        let mut wrong = Vec::new();
        for (what, found, wanted) in [
            ("volume images", &found.volume_images, volumes),
            ("volume records", &found.volume_records, volumes),
            ("archive images", &found.archive_images, archives),
            ("archive records", &found.archive_records, archives),
            ("snapshot images", &found.snapshot_images, snapshots),
        ] {
            if found != wanted {
                wrong.push(format!(
                    "{what} {:?} beyond what the agent lists, {:?} missing",
                    found.difference(wanted).collect::<Vec<_>>(),
                    wanted.difference(found).collect::<Vec<_>>()
                ));
            }
        }
        Ok(wrong)
    }

    /// Waits for [`Self::differences`] to come to none: the agent purges leftovers in
    /// the background once it serves.
    pub async fn settled(
        &self,
        volumes: &BTreeSet<String>,
        archives: &BTreeSet<String>,
        snapshots: &BTreeSet<String>,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let wrong = self.differences(volumes, archives, snapshots)?;
            if wrong.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "the image area holds what the agent does not list, 30 s after its start: {}",
                    wrong.join("; ")
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The filesystem in an image, mounted read-only through a read-only loop device in a
/// directory of its own; unmounted when dropped. A journal that needs recovery is
/// refused, not replayed into the copy: archives and snapshots are copied and changed
/// unmounted by the agent, so each must be a clean filesystem.
pub struct ReadOnlyImage {
    dir: tempfile::TempDir,
}

impl ReadOnlyImage {
    pub fn mount(image: &Path) -> anyhow::Result<Self> {
        ensure!(image.is_file(), "{} is not on the copy", image.display());
        let dir = tempfile::tempdir()?;
        crate::run(
            "mount",
            &[
                "-t".as_ref(),
                "ext4".as_ref(),
                "-o".as_ref(),
                "loop,ro,nodev,nosuid,noexec".as_ref(),
                image.as_os_str(),
                dir.path().as_os_str(),
            ],
        )
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("{} does not mount read-only", image.display()))?;
        Ok(Self { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for ReadOnlyImage {
    fn drop(&mut self) {
        if crate::run("umount", &[self.dir.path()]).is_err() {
            // Detached now, gone once released; the temp dir must not be emptied
            // through a mount.
            let _ = crate::run("umount", &["--lazy".as_ref(), self.dir.path().as_os_str()]);
        }
    }
}

/// The file behind the loop device mounted at `dir`, as the kernel names it; `None`
/// when what is mounted there (if anything) is not a loop device.
pub fn mounted_image(dir: &Path) -> anyhow::Result<Option<PathBuf>> {
    let table = std::fs::read_to_string("/proc/self/mountinfo")?;
    let wanted = dir.to_string_lossy();
    // The last line for the point is the mount on top. Temp directory names and volume
    // paths hold no character the table escapes.
    let Some(source) = table
        .lines()
        .filter(|line| line.split(' ').nth(4) == Some(wanted.as_ref()))
        .filter_map(|line| line.split_once(" - ")?.1.split(' ').nth(1))
        .next_back()
    else {
        return Ok(None);
    };
    let Some(device) = source.strip_prefix("/dev/") else {
        return Ok(None);
    };
    let backing = Path::new("/sys/block")
        .join(device)
        .join("loop/backing_file");
    match std::fs::read_to_string(&backing) {
        Ok(file) => Ok(Some(PathBuf::from(file.trim_end()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("read {}", backing.display())),
    }
}

/// Fails unless the volume at `dir` is mounted from `image`.
pub fn ensure_mounted_from(dir: &Path, image: &Path) -> anyhow::Result<()> {
    let wanted = std::fs::canonicalize(image)
        .with_context(|| format!("{} is not on the copy", image.display()))?;
    match mounted_image(dir)? {
        Some(found) if found == wanted => Ok(()),
        Some(found) => bail!(
            "{} is mounted from {}, not from its image {}",
            dir.display(),
            found.display(),
            wanted.display()
        ),
        None => bail!("{} is not mounted from an image", dir.display()),
    }
}
