//! Shared helpers for the integration tests: the real binary, run on files the test writes.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn rollgate() -> assert_cmd::Command {
    let mut cmd = assert_cmd::Command::cargo_bin("rollgate").expect("binary built");
    cmd.env_remove("NICKEL_IMPORT_PATH").env("NO_COLOR", "1");
    cmd
}

pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&path, text).unwrap();
    path
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
