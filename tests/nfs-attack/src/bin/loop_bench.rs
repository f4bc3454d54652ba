//! What a filesystem per volume costs on this machine: `nfsprov-loop-bench [COUNT]`
//! (root) prints the loop device limits, the time to make and mount a 1 GiB sparse ext4
//! and XFS image (the median of three), and the time to loop-mount COUNT (default 100)
//! small ext4 images at once and to unmount them.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nfsprov_nfs_attack::filesystems::{FsKind, Mounted, make_image};
use nfsprov_nfs_attack::setup::Result;

const GIB_IN_MIB: u64 = 1024;

fn main() -> ExitCode {
    let count: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(100);
    match bench(count) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn bench(count: usize) -> Result<()> {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|e| format!("unreadable: {e}"))
    };
    println!(
        "/dev/loop-control present: {}",
        Path::new("/dev/loop-control").exists()
    );
    println!(
        "loop max_loop: {}",
        read("/sys/module/loop/parameters/max_loop")
    );
    println!(
        "loop max_part: {}",
        read("/sys/module/loop/parameters/max_part")
    );
    let nodes = std::fs::read_dir("/dev")?
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.strip_prefix("loop")
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .count();
    println!("/dev/loopN nodes before: {nodes}");

    let dir = tempfile::tempdir()?;
    for kind in [FsKind::Ext4, FsKind::Xfs] {
        let mut makes = Vec::new();
        let mut mounts = Vec::new();
        for round in 0..3 {
            let image = dir.path().join(format!("{}-{round}.img", kind.name()));
            let start = Instant::now();
            make_image(&image, kind, GIB_IN_MIB)?;
            makes.push(start.elapsed());
            let start = Instant::now();
            let mounted = Mounted::loop_image(&image, &dir.path().join(format!("m-{round}")), &[])?;
            mounts.push(start.elapsed());
            drop(mounted);
            std::fs::remove_file(&image)?;
        }
        println!(
            "{} 1 GiB sparse image: mkfs {:?}, mount {:?} (median of 3)",
            kind.name(),
            median(makes),
            median(mounts)
        );
    }

    let images: Vec<_> = (0..count)
        .map(|n| dir.path().join(format!("small-{n}.img")))
        .collect();
    let start = Instant::now();
    for image in &images {
        make_image(image, FsKind::Ext4, 16)?;
    }
    println!("{count} ext4 16 MiB images made in {:?}", start.elapsed());
    let start = Instant::now();
    let mut mounted = Vec::new();
    for (n, image) in images.iter().enumerate() {
        match Mounted::loop_image(image, &dir.path().join(format!("small-{n}")), &[]) {
            Ok(m) => mounted.push(m),
            Err(e) => {
                println!("mount {n} failed: {e}");
                break;
            }
        }
    }
    println!("{} loop mounts in {:?}", mounted.len(), start.elapsed());
    let start = Instant::now();
    let done = mounted.len();
    drop(mounted);
    println!("{done} unmounts in {:?}", start.elapsed());
    Ok(())
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}
