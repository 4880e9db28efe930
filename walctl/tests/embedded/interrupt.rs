//! A cancel interrupts a step that waits on the network: a `walctl serve` on the embedded redb store readies a Kafka
//! topic pool whose one broker nobody listens on (`[wal.backoff] deadline = "90s"`, so the bootstrap's step would
//! wait that long), and `walctl procedures cancel` from another process ends the bootstrap while its step waits.
//!
//! The bootstrap runs in the server because a redb file admits one process at a time: a `walctl bootstrap` holding
//! the file could not be reached by another walctl's `procedures cancel` (on etcd it can).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::support::{Env, walctl_path};

const ID: &str = "topic_bootstrap/walctl_dead";

/// Far more than the cancel takes, far less than the 90 s the step would wait: only a step that is not interrupted
/// runs into it. (The figure itself is printed, not asserted: this machine is shared.)
const PATIENCE: Duration = Duration::from_secs(30);

/// A loopback port nobody listens on: bound, then released.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// The `walctl serve` process, killed on drop.
struct Server {
    child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `walctl --server URL --json procedures show ID`, when the server answers.
fn show(dir: &Path, url: &str) -> Option<Value> {
    let out = Command::new(walctl_path())
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .args(["--server", url, "--json", "procedures", "show", ID])
        .output()
        .expect("run walctl");
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

fn events(shown: &Value) -> Vec<Value> {
    shown["events"].as_array().cloned().unwrap_or_default()
}

/// Polls `show` until `done` holds of what it shows, or fails the test after [`PATIENCE`] with the server's log.
fn until(dir: &Path, url: &str, log: &Path, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(shown) = show(dir, url)
            && done(&shown)
        {
            return shown;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {PATIENCE:?}; last shown {:?}; server log:\n{}",
            show(dir, url),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_cancel_from_another_process_ends_a_bootstrap_step_waiting_on_a_dead_broker() {
    let env = Env::new();
    let broker = format!("127.0.0.1:{}", free_port());
    let listen = format!("127.0.0.1:{}", free_port());
    let config = env.write(
        "dead.toml",
        &format!(
            "[wal]\nprovider = \"kafka\"\nbroker_endpoints = [\"{broker}\"]\ntopic_name_prefix = \"walctl_dead\"\n\
             [wal.backoff]\ninit = \"50ms\"\nmax = \"200ms\"\ndeadline = \"90s\"\n"
        ),
    );
    let log = env.dir.path().join("serve.log");
    let file = std::fs::File::create(&log).expect("create log");
    let err = file.try_clone().expect("clone log");
    let _server = Server {
        child: Command::new(walctl_path())
            .current_dir(env.dir.path())
            .env("RUST_LOG", "info")
            .arg("--config")
            .arg(&config)
            .args(["serve", "--listen", &listen])
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("spawn walctl serve"),
    };
    let url = format!("http://{listen}");
    let dir = env.dir.path();

    // The leader readies the pool: the bootstrap's step that reaches the broker starts, and waits.
    let waiting = until(dir, &url, &log, "the bootstrap's step waits", |shown| {
        shown["state"] == "running"
            && events(shown)
                .last()
                .is_some_and(|e| e["event"] == "step_started" && e["step"] == "CreateMissing")
    });
    let step_started_ms = events(&waiting).last().and_then(|e| e["at_ms"].as_u64());

    let requested_ms = now_ms();
    let requested = Instant::now();
    let out = Command::new(walctl_path())
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .args(["--server", &url, "procedures", "cancel", ID])
        .output()
        .expect("run walctl");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("cancel of procedure {ID} requested")),
        "{stdout}"
    );

    let cancelled = until(dir, &url, &log, "the bootstrap ends cancelled", |shown| {
        shown["state"] == "cancelled"
    });
    let seen = requested.elapsed();
    assert_eq!(
        cancelled["error"],
        "cancelled (no rollback: procedure type 'remote_wal::TopicBootstrap' has none at this step)",
        "{cancelled}"
    );
    // The step that waited never ended on its own: the cancel followed its start, with no retry, failure or end of
    // the step between them.
    let names: Vec<String> = events(&cancelled)
        .iter()
        .map(|e| e["event"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        names[names.len() - 3..],
        ["step_started", "cancel_requested", "cancelled"],
        "{cancelled}"
    );
    let ended_ms = cancelled["updated_at_ms"].as_u64().unwrap_or_default();
    eprintln!(
        "cancel of a bootstrap step waiting on a dead broker (deadline 90 s): the server wrote `cancelled` {} ms \
         after the cancel command started ({} ms after the step started); the test saw it after {seen:?}",
        ended_ms.saturating_sub(requested_ms),
        step_started_ms.map_or(0, |s| ended_ms.saturating_sub(s)),
    );
    assert!(seen < PATIENCE, "{seen:?}");
}
