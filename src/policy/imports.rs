//! Where a policy may import from. A policy comes from a pull request, and CI runs it with the
//! job's permissions: `import "/proc/self/environ" as 'Text` would print the job's secrets
//! through `export` or a diagnostic. So before Nickel evaluates anything, every import reachable
//! from the input is resolved the way Nickel resolves it (the importing file's folder first,
//! then each import-path folder in order) and must land, symlinks followed, inside an allowed
//! folder: the input's own folder tree, an `--import-path` or `NICKEL_IMPORT_PATH` folder, or
//! the bundled contract's. Imports also obey `--max-file-bytes`. `--allow-import-anywhere`
//! lifts the folder rule (not the size rule) for trusted inputs.
//!
//! This runs inside the evaluation sandbox: Nickel's parser recurses, and a deeply nested file
//! must crash the sandbox child, not rollgate.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use nickel_lang_core::ast::primop::PrimOp;
use nickel_lang_core::ast::{Ast, AstAlloc, Import, InputFormat, Node};
use nickel_lang_core::files::Files;
use nickel_lang_core::parser::{grammar::TermParser, lexer::Lexer, ErrorTolerantParser};
use nickel_lang_core::position::TermPos;
use nickel_lang_core::traverse::{TraverseAlloc, TraverseControl};

use super::bundle::CONTRACT_FILE;
use super::PolicyError;

/// The name the contract file gives the policy contract.
const CONTRACT_NAME: &str = "RolloutPolicy";

/// What an input may reach.
#[derive(Debug, Clone)]
pub struct ImportRules {
    /// Folders an import may resolve into (canonical).
    pub allowed: Vec<PathBuf>,
    /// Where Nickel looks after the importing file's own folder, in order.
    pub search: Vec<PathBuf>,
    pub anywhere: bool,
    pub max_file_bytes: u64,
}

impl ImportRules {
    /// The rules for evaluating `input`: its folder tree joins the allowed folders.
    pub fn for_input(&self, input: &Path) -> ImportRules {
        let mut rules = self.clone();
        if let Some(folder) = canonical(input).and_then(|p| p.parent().map(Path::to_path_buf)) {
            rules.allowed.push(folder);
        }
        rules
    }
}

fn canonical(path: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(path).ok()
}

/// One `import "..."` found in a file.
struct Found {
    path: PathBuf,
    format: InputFormat,
    offset: usize,
}

/// What the walk over an input's imports learnt besides their being allowed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Walked {
    /// The input reaches a `rollout-policy.ncl` through its imports and a file it reaches names
    /// `RolloutPolicy` (as a variable or a field): it applies the contract itself, so Nickel's
    /// own evaluation has already held it to it — and to Nickel's rules, under which a record
    /// the contract checked may be merged with more fields afterwards (the lesson's
    /// `edge & { max_polls = ... }`).
    pub applies_contract: bool,
}

/// Checks every import reachable from the Nickel file `input`. A file that does not parse is
/// left to Nickel, whose diagnostic says more; an import Nickel cannot find is too.
pub fn check(input: &Path, rules: &ImportRules) -> Result<Walked, PolicyError> {
    let (mut reaches_contract, mut names_contract) = (false, false);
    let mut seen = HashSet::new();
    let mut queue = vec![input.to_path_buf()];
    while let Some(file) = queue.pop() {
        let Some(real) = canonical(&file) else {
            continue;
        };
        if !seen.insert(real) {
            continue;
        }
        let Ok(source) = std::fs::read_to_string(&file) else {
            continue;
        };
        if !may_import(&source) {
            continue;
        }
        let (found_imports, names) = imports_in(&file, &source);
        names_contract |= names;
        for found in found_imports {
            let Some(target) = resolve(&file, &found.path, &rules.search) else {
                continue;
            };
            reaches_contract |= target.file_name() == Some(CONTRACT_FILE.as_ref());
            let refuse = |reason: String| {
                let (line, column) = line_and_column(&source, found.offset);
                PolicyError::Import {
                    file: file.clone(),
                    line,
                    column,
                    import: found.path.display().to_string(),
                    reason,
                }
            };
            let real = canonical(&target).unwrap_or_else(|| target.clone());
            if !rules.anywhere && !rules.allowed.iter().any(|folder| real.starts_with(folder)) {
                return Err(refuse(format!(
                    "resolves to {}, outside the policy's folder, the import-path folders and the bundled contract; \
                     pass --allow-import-anywhere only for a policy you trust",
                    real.display()
                )));
            }
            let size = std::fs::metadata(&real).map_or(0, |m| m.len());
            if size > rules.max_file_bytes {
                return Err(refuse(format!(
                    "{} is {size} bytes, over the {}-byte limit (raise it with --max-file-bytes)",
                    real.display(),
                    rules.max_file_bytes
                )));
            }
            if found.format == InputFormat::Nickel {
                queue.push(target);
            }
        }
    }
    Ok(Walked {
        applies_contract: reaches_contract && names_contract,
    })
}

/// Whether a source holds the `import` keyword, by Nickel's own lexer (comments and strings
/// that mention the word do not count): a file without it imports nothing and is not parsed.
/// The lexer costs a fraction of the parser, and the bundled contract has no import. A source
/// the lexer stops on is parsed anyway.
fn may_import(source: &str) -> bool {
    use nickel_lang_core::parser::lexer::{NormalToken, Token};
    source.contains("import")
        && Lexer::new(source).any(|token| {
            matches!(
                token,
                Ok((_, Token::Normal(NormalToken::Import), _)) | Err(_)
            )
        })
}

/// Every path import in a Nickel source, with its byte offset; and whether the source names
/// the contract (`RolloutPolicy` as a variable, or as a field taken from a record).
fn imports_in(file: &Path, source: &str) -> (Vec<Found>, bool) {
    let mut files = Files::empty();
    let id = files.add(file.as_os_str(), source);
    let alloc = AstAlloc::new();
    let Ok(ast) = TermParser::new().parse_strict(&alloc, id, Lexer::new(source)) else {
        return (Vec::new(), false);
    };
    let mut found = Vec::new();
    let mut names_contract = false;
    ast.traverse_ref(
        &mut |node: &Ast, _: &()| {
            match &node.node {
                Node::Var(name)
                | Node::PrimOpApp {
                    op: PrimOp::RecordStatAccess(name),
                    ..
                } if name.label() == CONTRACT_NAME => names_contract = true,
                _ => {}
            }
            if let Node::Import(Import::Path { path, format }) = &node.node {
                found.push(Found {
                    path: PathBuf::from(*path),
                    format: *format,
                    offset: match node.pos {
                        TermPos::Original(span) | TermPos::Inherited(span) => span.start.to_usize(),
                        TermPos::None => 0,
                    },
                });
            }
            TraverseControl::<(), ()>::Continue
        },
        &(),
    );
    (found, names_contract)
}

/// The file Nickel would load for `import "path"` written in `importer`: the first that exists
/// of the importer's folder, then each search folder, joined with `path` (an absolute `path`
/// replaces the folder, as `PathBuf::push` does in Nickel's own resolver).
fn resolve(importer: &Path, path: &Path, search: &[PathBuf]) -> Option<PathBuf> {
    let own = importer.parent().map(Path::to_path_buf).unwrap_or_default();
    std::iter::once(own)
        .chain(search.iter().cloned())
        .map(|folder| folder.join(path))
        .find(|candidate| candidate.is_file())
}

/// 1-based line and column of a byte offset, as diagnostics print them.
fn line_and_column(source: &str, offset: usize) -> (usize, usize) {
    let before = &source[..offset.min(source.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(allowed: &Path) -> ImportRules {
        ImportRules {
            allowed: vec![std::fs::canonicalize(allowed).unwrap()],
            search: Vec::new(),
            anywhere: false,
            max_file_bytes: 1000,
        }
    }

    #[test]
    fn imports_inside_the_tree_pass_and_outside_are_named_with_their_place() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "s3cret").unwrap();
        let tree = tempfile::tempdir().unwrap();
        std::fs::create_dir(tree.path().join("lib")).unwrap();
        std::fs::write(tree.path().join("lib/helper.ncl"), "{ a = 1 }").unwrap();
        let good = tree.path().join("good.ncl");
        std::fs::write(&good, "let h = import \"lib/helper.ncl\" in h").unwrap();
        assert!(check(&good, &rules(tree.path())).is_ok());

        // Reached through a helper inside the tree, two lines down.
        std::fs::write(
            tree.path().join("lib/sneaky.ncl"),
            format!(
                "{{\n  x =\n    import \"{}\" as 'Text }}",
                outside.path().join("secret.txt").display()
            ),
        )
        .unwrap();
        let bad = tree.path().join("bad.ncl");
        std::fs::write(&bad, "import \"lib/sneaky.ncl\"").unwrap();
        let err = check(&bad, &rules(tree.path())).unwrap_err().to_string();
        assert!(err.contains("sneaky.ncl:3:5"), "{err}");
        assert!(err.contains("--allow-import-anywhere"), "{err}");
        assert!(!err.contains("s3cret"));

        let mut anywhere = rules(tree.path());
        anywhere.anywhere = true;
        assert!(check(&bad, &anywhere).is_ok());
    }

    #[test]
    fn only_the_import_keyword_makes_a_file_worth_parsing() {
        assert!(!may_import("# see --import-path\n{ a = \"import\" }"));
        assert!(may_import("let x = import \"y.ncl\" in x"));
        assert!(may_import("{ a = \"%{import \"y.ncl\"}\" }"));
        assert!(!may_import("{ a = 1 }"));
    }

    #[test]
    fn a_symlink_out_of_the_tree_and_an_oversized_import_are_refused() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("big.ncl"), "1".repeat(2000)).unwrap();
        let tree = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path().join("big.ncl"), tree.path().join("link.ncl"))
            .unwrap();
        let via_link = tree.path().join("p.ncl");
        std::fs::write(&via_link, "import \"link.ncl\"").unwrap();
        let err = check(&via_link, &rules(tree.path()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("outside the policy's folder"), "{err}");
        let mut anywhere = rules(tree.path());
        anywhere.anywhere = true;
        let err = check(&via_link, &anywhere).unwrap_err().to_string();
        assert!(err.contains("over the 1000-byte limit"), "{err}");
    }
}
