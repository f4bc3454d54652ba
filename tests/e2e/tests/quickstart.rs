//! The commands `deploy/quickstart.sh` prints are run as printed: its demo (`nfsprov-demo`,
//! on the simulator) is started, and the `nfs-cp` and `nfs-cat` lines it prints write a
//! 1 MiB file of the test's own into the demo claim and read it back, byte for byte.
//! (libnfs-utils' `nfs-cp` cannot write more than about 4 KB over NFSv4, which a line
//! with an NFSv4 URL would hit at once.)

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nfsprov_e2e::binaries::binary;

const TEST: &str = "the_printed_commands_write_and_read_back_a_one_mebibyte_file";
/// Building nothing (the harness built the binaries), starting the simulator, ganesha,
/// an agent and the controller and provisioning one claim take well under this.
const READY: Duration = Duration::from_secs(180);

/// Stops a process with SIGINT (the demo stops what it started on Ctrl-C), then kills it.
struct Interrupted(Child);

impl Drop for Interrupted {
    fn drop(&mut self) {
        let pid = rustix::process::Pid::from_child(&self.0);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn rpcbind_runs() -> bool {
    std::net::TcpStream::connect("127.0.0.1:111").is_ok()
}

/// Runs one printed line through the shell, `/tmp/f` standing for `file`; its stdout.
fn run(line: &str, file: &str) -> anyhow::Result<Vec<u8>> {
    let line = line.replacen("/tmp/f", file, 1);
    let output = Command::new("sh").arg("-c").arg(&line).output()?;
    anyhow::ensure!(
        output.status.success(),
        "{line}: {} {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(output.stdout)
}

#[test]
fn the_printed_commands_write_and_read_back_a_one_mebibyte_file() -> anyhow::Result<()> {
    if let Some(why) = nfsprov_e2e::requirements::missing_parts(
        "ganesha serves as root",
        &["ganesha.nfsd", "nfs-cp", "nfs-cat", "nfs-ls"],
    ) {
        nfsprov_test_skip::skip(TEST, &why);
        return Ok(());
    }
    // The quickstart starts rpcbind when none runs; so does this test, for its own run.
    let _rpcbind = if rpcbind_runs() {
        None
    } else {
        let Some(rpcbind) = ["/usr/sbin/rpcbind", "/sbin/rpcbind"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
        else {
            nfsprov_test_skip::skip(TEST, "rpcbind is not installed (Debian: rpcbind)");
            return Ok(());
        };
        let child = Interrupted(Command::new(rpcbind).args(["-f", "-w"]).spawn()?);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !rpcbind_runs() {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "rpcbind did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(child)
    };

    let demo_binary = binary("nfsprov-demo")?;
    let mut demo = Command::new(&demo_binary);
    // The binaries beside it were just built, as the test suite builds them: the demo
    // finds them there instead of building the workspace again its own way (a build of
    // the binaries alone resolves features apart from the tests' and, on a machine
    // busy with the rest of the suite, took longer than READY).
    if let Some(dir) = demo_binary.parent() {
        demo.env("NFSPROV_BIN_DIR", dir);
    }
    demo.env_remove("KUBECONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut demo = Interrupted(demo.spawn()?);
    let stdout = demo.0.stdout.take().expect("piped");
    let (lines, printed) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + READY;
    let mut shown = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match printed.recv_timeout(left) {
            Ok(line) => {
                let done = line.contains("Press Ctrl-C");
                shown.push(line);
                if done {
                    break;
                }
            }
            Err(_) => anyhow::bail!(
                "the demo did not get ready; it printed:\n{}",
                shown.join("\n")
            ),
        }
    }
    let command = |tool: &str| {
        shown
            .iter()
            .map(|l| l.trim())
            .find(|l| l.starts_with(tool))
            .map(str::to_owned)
            .ok_or_else(|| anyhow::anyhow!("no {tool} line in:\n{}", shown.join("\n")))
    };
    let (write, read) = (command("nfs-cp /tmp/f ")?, command("nfs-cat ")?);

    let file = tempfile::NamedTempFile::new()?;
    // Not a repeated pattern: each 4 KiB block differs, so a block written twice or
    // left out shows.
    let data: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(file.path(), &data)?;
    let path = file.path().display().to_string();
    run(&write, &path)?;
    let back = run(&read, &path)?;
    assert_eq!(back.len(), data.len(), "{read}");
    assert!(back == data, "{read} read other bytes than {write} wrote");
    Ok(())
}
