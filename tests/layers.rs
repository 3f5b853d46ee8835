//! The direction of the code: host primitives at the bottom, the engine and the commands above
//! them. Each rule lists the top-level modules a folder may name (`crate::NAME`, in `use`
//! lines or inline paths); a file naming any other breaks the build's tests.

mod common;
use common::repo;

use std::path::Path;

/// `crate::NAME` paths a source text names, comments left out.
fn named_modules(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && !found.contains(&name) {
                found.push(name);
            }
            rest = after;
        }
    }
    found
}

/// Every `.rs` file under `folder` (or the file `folder.rs`) with the modules it names that
/// `allowed` does not list.
fn breaks(folder: &str, allowed: &[&str]) -> Vec<(String, String)> {
    let src = repo().join("src");
    let mut files = Vec::new();
    collect(&src.join(folder), &mut files);
    let single = src.join(format!("{folder}.rs"));
    if single.is_file() {
        files.push(single);
    }
    let mut broken = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for name in named_modules(&text) {
            if name != folder && !allowed.contains(&name.as_str()) {
                let shown = file.strip_prefix(&src).unwrap().display().to_string();
                broken.push((shown, name));
            }
        }
    }
    broken
}

fn collect(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

#[test]
fn the_checker_sees_a_lower_layer_naming_a_higher_one() {
    let text = "use crate::host::state::Root;\n// crate::rollout in a comment\nlet x = crate::deploy::run();";
    assert_eq!(named_modules(text), ["host", "deploy"]);
}

#[test]
fn the_host_names_nothing_above_it() {
    // The policy is a leaf: its types (probe and hook settings) may be used by anyone.
    assert_eq!(breaks("host", &["policy"]), Vec::<(String, String)>::new());
}

#[test]
fn the_policy_is_a_leaf() {
    assert_eq!(breaks("policy", &[]), Vec::<(String, String)>::new());
}

#[test]
fn rendering_names_nothing_of_rollgate() {
    assert_eq!(breaks("render", &[]), Vec::<(String, String)>::new());
}

#[test]
fn the_engine_prints_without_the_log_analysis() {
    // Formats, tables and times come from `render`; the engine does not need the log's queries.
    assert_eq!(
        breaks(
            "rollout",
            &["host", "policy", "render", "deploy", "proxy", "release"]
        ),
        Vec::<(String, String)>::new()
    );
}

#[test]
fn the_proxy_log_and_releases_stay_below_the_engine_and_the_commands() {
    let below = ["host", "policy", "log", "render"];
    for folder in ["proxy", "log", "release"] {
        assert_eq!(
            breaks(folder, &below),
            Vec::<(String, String)>::new(),
            "{folder}"
        );
    }
}
