//! `walctl` on the secure etcd the test command starts (TLS, client certificates required, auth enabled; the
//! `ETCD_SECURE_*` variables): embedded commands (create-table, procedures list) join the election and run, a
//! `walctl serve` becomes leader and takes a create — also after its auth token expired (the secure etcd's tokens
//! last 5 idle seconds) — and a wrong password is one error naming the endpoint. No output of any of them carries
//! the password.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::cluster::{Servers, create_table_following_the_leader};
use crate::support::{assert_one_line_error, endpoints, walctl_path};

/// The secure etcd's certificates and password file, from the environment (the test fails when unset).
fn secure() -> (Vec<String>, PathBuf, PathBuf) {
    let etcd = endpoints("ETCD_SECURE_ENDPOINTS");
    let var = |name: &str| {
        let value = std::env::var(name).unwrap_or_default();
        assert!(
            !value.is_empty(),
            "{name} is not set: this test needs the secure etcd (run through scripts/test.sh)"
        );
        PathBuf::from(value)
    };
    (
        etcd,
        var("ETCD_SECURE_CERTS"),
        var("ETCD_SECURE_PASSWORD_FILE"),
    )
}

/// The `[metadata_store]` security lines for the secure etcd, with `password_file`.
fn security_toml(certs: &std::path::Path, password_file: &std::path::Path) -> String {
    format!(
        "tls = {{ ca = {:?}, cert = {:?}, key = {:?} }}\nusername = \"walctl\"\npassword_file = {:?}\n",
        certs.join("ca.pem"),
        certs.join("client.pem"),
        certs.join("client.key"),
        password_file,
    )
}

/// A config on the secure etcd (fresh key prefix) with the `[metadata_store]` security lines inserted.
fn secure_toml(password_file: Option<&std::path::Path>) -> String {
    let (etcd, certs, real_password) = secure();
    let (toml, _) = Servers::etcd_toml(&etcd, "");
    let security = security_toml(&certs, password_file.unwrap_or(&real_password));
    toml.replacen(
        "[metadata_store]\n",
        &format!("[metadata_store]\n{security}"),
        1,
    )
}

fn password() -> String {
    let (_, _, file) = secure();
    std::fs::read_to_string(file)
        .expect("read the password file")
        .trim_end()
        .to_string()
}

/// Runs `walctl --config CONFIG ARGS` in `dir`; returns (success, stdout + stderr).
fn walctl(dir: &std::path::Path, config: &std::path::Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(walctl_path())
        .arg("--config")
        .arg(config)
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "debug")
        .output()
        .expect("run walctl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn embedded_commands_run_over_the_secure_etcd_and_never_print_the_password() {
    let secret = password();
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("secure.toml");
    std::fs::write(&config, secure_toml(None)).expect("write config");
    for args in [
        vec!["create-table", "secure_a", "--regions", "2"],
        vec!["--json", "procedures", "list"],
        vec!["procedures", "list"],
    ] {
        let (ok, output) = walctl(dir.path(), &config, &args);
        assert!(ok, "{args:?}: {output}");
        assert!(
            !output.contains(&secret),
            "{args:?} printed the password (debug logs included)"
        );
    }
    let (_, listed) = walctl(dir.path(), &config, &["--json", "procedures", "list"]);
    assert!(
        listed.contains("secure_a"),
        "the table's procedure is listed: {listed}"
    );
}

#[test]
fn a_server_leads_and_creates_over_the_secure_etcd_also_after_its_token_expired() {
    let secret = password();
    let servers = Servers::start(secure_toml(None), 1);
    let leader = servers.wait_for_leader(&[0]);
    let addresses = vec![servers.servers[leader].address.clone()];
    let (first, _) = create_table_following_the_leader(&addresses, "secure_s1", "secure-s1", None);
    // Longer than the secure etcd's token TTL (5 idle seconds): a token the server holds may expire meanwhile.
    std::thread::sleep(Duration::from_secs(7));
    let (second, _) = create_table_following_the_leader(&addresses, "secure_s2", "secure-s2", None);
    assert_ne!(first, second);
    let log = std::fs::read_to_string(&servers.servers[leader].log).expect("read the log");
    assert!(!log.contains(&secret), "the server's log has the password");
    let noisy: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    assert!(
        noisy.is_empty(),
        "the server warned on a success path: {noisy:#?}"
    );
}

#[test]
fn a_wrong_password_is_one_error_naming_the_endpoint() {
    let (etcd, _, _) = secure();
    let dir = tempfile::tempdir().expect("temp dir");
    let wrong = dir.path().join("wrong.password");
    std::fs::write(&wrong, "wrong-password-123\n").expect("write password");
    let config = dir.path().join("wrong.toml");
    std::fs::write(&config, secure_toml(Some(&wrong))).expect("write config");
    for args in [
        vec!["procedures", "list"],
        vec!["create-table", "never", "--regions", "1"],
    ] {
        let out = Command::new(walctl_path())
            .arg("--config")
            .arg(&config)
            .args(&args)
            .current_dir(dir.path())
            .env_remove("RUST_LOG")
            .output()
            .expect("run walctl");
        assert!(
            !out.status.success(),
            "{args:?} succeeded with a wrong password"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_one_line_error(&stderr);
        assert!(
            stderr.contains(&etcd[0]),
            "{args:?}: names the endpoint: {stderr}"
        );
        assert!(
            stderr.contains("authentication failed"),
            "{args:?}: says why: {stderr}"
        );
        assert!(!stderr.contains("wrong-password-123"), "{args:?}: {stderr}");
    }
}
