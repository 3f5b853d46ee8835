//! The README stays short and leads to every page of `docs/`; no link in them is broken.

use crate::common::repo;

/// The relative link targets (`](path)` or `](path#anchor)`) in a Markdown text.
fn links(text: &str) -> Vec<String> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .map(|target| target.split('#').next().unwrap_or("").to_string())
        .filter(|target| !target.is_empty() && !target.contains("://"))
        .collect()
}

#[test]
fn the_readme_is_short_and_every_docs_page_is_linked() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 150,
        "README.md has {lines} lines; keep it at most 150"
    );
    let readme_links = links(&readme);
    let index = std::fs::read_to_string(repo().join("docs/README.md")).unwrap();
    let index_links = links(&index);
    for entry in std::fs::read_dir(repo().join("docs")).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".md") || name == "README.md" {
            continue;
        }
        assert!(
            readme_links.contains(&format!("docs/{name}")),
            "README.md does not link docs/{name}"
        );
        assert!(
            index_links.contains(&name),
            "docs/README.md does not link {name}"
        );
    }
}

#[test]
fn no_link_in_the_readme_or_the_docs_is_broken() {
    let mut pages = vec![repo().join("README.md")];
    for entry in std::fs::read_dir(repo().join("docs")).unwrap().flatten() {
        if entry.path().extension().is_some_and(|e| e == "md") {
            pages.push(entry.path());
        }
    }
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        let folder = page.parent().unwrap();
        for target in links(&text) {
            assert!(
                folder.join(&target).exists(),
                "{}: link to {target} is broken",
                page.display()
            );
        }
    }
}

#[test]
fn the_exit_code_table_is_the_one_the_code_has() {
    let page = std::fs::read_to_string(repo().join("docs/exit-codes.md")).unwrap();
    let table = rollgate::error::exit_code_table();
    assert!(
        page.contains(&table),
        "docs/exit-codes.md does not hold the table src/error.rs gives; put this in it:\n{table}"
    );
}

#[test]
fn the_policy_table_is_the_one_the_code_has() {
    let page = std::fs::read_to_string(repo().join("docs/policy.md")).unwrap();
    let table = rollgate::defaults::policy_table();
    assert!(
        page.contains(&table),
        "docs/policy.md does not hold the table src/defaults.rs gives; put this in it:\n{table}"
    );
}

#[test]
fn the_contracts_ranges_are_the_ones_the_code_has() {
    let contract = std::fs::read_to_string(repo().join("contracts/rollout-policy.ncl")).unwrap();
    let block = contract
        .split("let ranges = {")
        .nth(1)
        .and_then(|rest| rest.split("\n}").next())
        .expect("the contract has its ranges table");
    let ranges: Vec<(String, u64, u64)> = block
        .lines()
        .filter(|line| line.contains("low ="))
        .map(|line| {
            let (name, rest) = line.trim().split_once(" = ").unwrap();
            let number = |key: &str| -> u64 {
                let after = rest.split(key).nth(1).unwrap();
                let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
                digits.parse().unwrap()
            };
            (name.to_string(), number("low = "), number("high = "))
        })
        .collect();
    let expected: Vec<(String, u64, u64)> = rollgate::defaults::POLICY_RANGES
        .iter()
        .map(|(name, low, high)| (name.to_string(), *low, *high))
        .collect();
    assert_eq!(ranges, expected);
}

/// docs/architecture.md names every source file, so a newcomer can find any of them there, and
/// names none that is gone.
#[test]
fn the_architecture_page_names_every_source_file() {
    let page = std::fs::read_to_string(repo().join("docs/architecture.md")).unwrap();
    let mut files = Vec::new();
    let mut folders = vec![repo().join("src")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path.strip_prefix(repo()).unwrap().display().to_string());
            }
        }
    }
    let unnamed: Vec<&String> = files
        .iter()
        .filter(|f| !page.contains(&format!("`{f}`")))
        .collect();
    assert!(
        unnamed.is_empty(),
        "not named in docs/architecture.md: {unnamed:?}"
    );
    let named_gone: Vec<&str> = page
        .split('`')
        .filter(|word| word.starts_with("src/") && word.ends_with(".rs"))
        .filter(|word| !repo().join(word).is_file())
        .collect();
    assert!(named_gone.is_empty(), "named but gone: {named_gone:?}");
}

/// Issue 81: the docs named `proxy::routes`, a module that never was (`router.rs`). Every
/// `` `ROOM::NAME `` a page names is a module of `src/ROOM/`, an item of the room's own file,
/// or a test of `tests/it/ROOM.rs`.
#[test]
fn every_module_path_the_docs_name_exists() {
    let rooms = [
        "proxy", "engine", "host", "commands", "log", "render", "release", "config",
    ];
    let mut pages = vec![repo().join("README.md")];
    for entry in std::fs::read_dir(repo().join("docs")).unwrap() {
        pages.push(entry.unwrap().path());
    }
    let read = |path: std::path::PathBuf| std::fs::read_to_string(path).unwrap_or_default();
    let mut unknown = Vec::new();
    for page in pages
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
    {
        let text = read(page.clone());
        for room in rooms {
            for rest in text.split(&format!("`{room}::")).skip(1) {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if name.is_empty() {
                    continue;
                }
                let src = repo().join("src").join(room);
                let module = src.join(format!("{name}.rs")).exists() || src.join(&name).is_dir();
                let own = read(src.join("mod.rs")) + &read(repo().join(format!("src/{room}.rs")));
                let word = |line: &str| {
                    line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .any(|w| w == name)
                };
                let item = ["fn", "struct", "enum", "mod", "const", "type", "static"]
                    .iter()
                    .any(|kind| own.contains(&format!("{kind} {name}")))
                    || own
                        .split("use ")
                        .skip(1)
                        .any(|used| word(used.split(';').next().unwrap_or("")));
                let test = read(repo().join(format!("tests/it/{room}.rs")))
                    .contains(&format!("fn {name}("));
                if !(module || item || test) {
                    unknown.push(format!("{}: {room}::{name}", page.display()));
                }
            }
        }
    }
    assert!(unknown.is_empty(), "{unknown:#?}");
}
