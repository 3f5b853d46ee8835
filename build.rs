//! Links the binary with packed relative relocations (DT_RELR) where the C library can load
//! them.
//!
//! rollgate is a large position-independent binary (polars and Nickel are in it): about 107 000
//! relative relocations, which the dynamic loader applied one 24-byte entry at a time at every
//! start. Packed, the table shrinks from 2.6 MB to 36 KB and a start is about 0.6 ms faster,
//! which is what brought a one-file `policy check` under `nickel export` (BENCHMARKS.md). Only
//! the final link changes, so no dependency is rebuilt for it.
//!
//! glibc loads DT_RELR from 2.36 on, and the linker marks such binaries as needing it, so the
//! flag is passed only for native Linux/glibc builds whose C library is at least that new.
//!
//! A dev build (`cargo run`, `cargo test`) is also linked as a fixed-address executable
//! (`-no-pie`): unoptimised, its 3 MB of `.data.rel.ro` and 3.5 MB GOT were relocated, page by
//! copied page, at every start (2 000 page faults and ~9 ms for `rollgate --version`; 470 and
//! ~4 ms without), and the test suite starts the binary thousands of times (each release is
//! started through rollgate's trampoline and is itself `rollgate sample-service`). Release
//! builds stay position-independent: address randomisation matters for a binary that faces
//! the network, and there relocation is a fraction of a millisecond.

use std::ffi::{c_char, CStr};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let target = std::env::var("TARGET").unwrap_or_default();
    let host = std::env::var("HOST").unwrap_or_default();
    if target == host && target.ends_with("-linux-gnu") && host_glibc_at_least(2, 36) {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    // PROFILE is "debug" for the dev and test profiles, "release" for release.
    if std::env::var("PROFILE").as_deref() == Ok("debug") && target.ends_with("-linux-gnu") {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn host_glibc_at_least(major: u32, minor: u32) -> bool {
    extern "C" {
        fn gnu_get_libc_version() -> *const c_char;
    }
    // SAFETY: glibc returns a pointer to a static NUL-terminated string such as "2.36".
    let version = unsafe { CStr::from_ptr(gnu_get_libc_version()) };
    let mut parts = version
        .to_str()
        .unwrap_or("")
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    found >= (major, minor)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn host_glibc_at_least(_major: u32, _minor: u32) -> bool {
    false
}
