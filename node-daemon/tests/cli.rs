//! The command line contract.

use std::process::Command;

fn meridian() -> Command {
    Command::new(env!("CARGO_BIN_EXE_meridian"))
}

#[test]
fn print_default_config_prints_the_embedded_file() {
    let out = meridian()
        .args(["run", "--print-default-config"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text, meridian_daemon::DEFAULT_CONFIG);
    assert!(text.contains("bind = \"127.0.0.1:1883\""));
}

#[test]
fn bad_config_is_refused_naming_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[storage]\nsync = \"always\"\nfsync = true\n").unwrap();
    let out = meridian()
        .arg("run")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("line 3"), "{err}");
    assert!(err.contains("fsync"), "{err}");
}

#[test]
fn non_loopback_listener_without_auth_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = meridian()
        .args([
            "run",
            "--mqtt",
            "0.0.0.0:0",
            "--admin",
            "127.0.0.1:0",
            "--ws",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("auth.password_file"), "{err}");
}
