//! Evaluating policies with nickel-lang-core: one file as `nickel export` would, or many in one
//! shared program. Every evaluation runs in the sandbox of `sandbox.rs`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nickel_lang_core::error::Error as NickelError;
use nickel_lang_core::eval::cache::CacheImpl;
use nickel_lang_core::identifier::LocIdent;
use nickel_lang_core::program::{FieldPath, Program, ProgramBuilder};
use nickel_lang_core::serialize::{self, ExportFormat};

use super::bundle::{contracts_dir, CONTRACT_FILE};
use super::diagnostic::Diagnostic;
use super::imports::{self, ImportRules, Walked};
use super::sandbox::{isolated, isolated_each};
use super::PolicyError;

/// How a policy file is read and evaluated.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// `--import-path` folders, searched after the importing file's own folder.
    pub import_paths: Vec<PathBuf>,
    /// Evaluation time limit per call.
    pub timeout: Duration,
    /// Larger inputs are refused before Nickel reads them.
    pub max_file_bytes: u64,
    /// Colour in rendered diagnostics.
    pub color: bool,
    /// Imports may leave the policy's folder tree and the import-path folders.
    pub allow_import_anywhere: bool,
}

impl Default for EvalOptions {
    fn default() -> Self {
        EvalOptions {
            import_paths: Vec::new(),
            timeout: Duration::from_secs(10),
            max_file_bytes: 10 << 20,
            color: false,
            allow_import_anywhere: false,
        }
    }
}

/// Nickel source files are evaluated as written; data files hold a map of service name to
/// policy and get the bundled contract applied to every entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    Nickel,
    Data,
}

impl InputKind {
    pub fn of(path: &Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some("json" | "yaml" | "yml" | "toml") => InputKind::Data,
            _ => InputKind::Nickel,
        }
    }
}

/// A successful evaluation.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Evaluated {
    pub value: serde_json::Value,
    /// The document in the requested format, byte for byte what `nickel export` prints.
    pub text: String,
}

/// Refuses what Nickel should never be handed: missing files, folders, huge or non-UTF-8 input.
pub fn check_input(path: &Path, opts: &EvalOptions) -> Result<(), PolicyError> {
    let input_error = |reason: String| PolicyError::Input {
        path: path.to_path_buf(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| input_error(io_reason(&e)))?;
    if meta.is_dir() {
        return Err(input_error("is a directory, not a policy file".into()));
    }
    if meta.len() > opts.max_file_bytes {
        return Err(input_error(format!(
            "is {} bytes, over the {}-byte limit (raise it with --max-file-bytes)",
            meta.len(),
            opts.max_file_bytes
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| input_error(io_reason(&e)))?;
    if let Err(e) = std::str::from_utf8(&bytes) {
        let at = e.valid_up_to();
        let line = bytes[..at].iter().filter(|b| **b == b'\n').count() + 1;
        return Err(input_error(format!(
            "is not UTF-8 text (invalid byte at line {line}, byte offset {at})"
        )));
    }
    Ok(())
}

fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

/// The folders imports are looked up in after the importing file's own folder:
/// `--import-path`, then `NICKEL_IMPORT_PATH` (colon-separated, as Nickel's CLI reads it), then
/// the bundled contracts; and the bundled contract itself, which data files are checked with.
fn import_paths(opts: &EvalOptions) -> Result<(Vec<PathBuf>, PathBuf), PolicyError> {
    let mut paths = opts.import_paths.clone();
    if let Some(env) = std::env::var_os("NICKEL_IMPORT_PATH") {
        paths.extend(std::env::split_paths(&env).filter(|p| !p.as_os_str().is_empty()));
    }
    let bundled = bundled_dir()?;
    let contract = bundled.join(CONTRACT_FILE);
    paths.push(bundled);
    Ok((paths, contract))
}

/// What imports may reach: the import-path folders (the bundled contract's among them); each
/// input adds its own folder tree (`ImportRules::for_input`).
fn import_rules(search: &[PathBuf], opts: &EvalOptions) -> ImportRules {
    ImportRules {
        allowed: search
            .iter()
            .filter_map(|folder| std::fs::canonicalize(folder).ok())
            .collect(),
        search: search.to_vec(),
        anywhere: opts.allow_import_anywhere,
        max_file_bytes: opts.max_file_bytes,
    }
}

fn bundled_dir() -> Result<PathBuf, PolicyError> {
    contracts_dir().map_err(|e| PolicyError::Bundle(e.to_string()))
}

/// Nickel string literal for a path: quotes, backslashes and `%` escaped.
fn nickel_string(path: &Path) -> String {
    let mut out = String::from("\"");
    for c in path.to_string_lossy().chars() {
        match c {
            '"' | '\\' | '%' => {
                out.push('\\');
                out.push(c);
            }
            '\n' => out.push_str("\\n"),
            _ => out.push(c),
        }
    }
    out.push('"');
    out
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The Nickel expression that evaluates one input with the contract applied to each of its
/// entries, whatever its format. A Nickel file that applies `RolloutPolicy` itself is taken as
/// Nickel evaluates it (`imports::Walked`): applying the contract a second time would refuse
/// what Nickel accepts — the fields merged into a checked record afterwards, which a closed
/// contract then calls extra. One that does not (a plain record of numbers, the most natural
/// file to write) is held to it all the same, so a misspelt field or a number out of range is
/// refused in every format.
fn checked_expression(path: &Path, contract: &Path, walked: Walked) -> String {
    let (contract, input) = (nickel_string(contract), nickel_string(&absolute(path)));
    if walked.applies_contract && InputKind::of(path) == InputKind::Nickel {
        return format!("import {input}");
    }
    match InputKind::of(path) {
        InputKind::Data => format!(
            "let {{ RolloutPolicy, .. }} = import {contract} in (import {input}) | {{ _ | RolloutPolicy }}"
        ),
        // A Nickel file holds either one policy (the lesson's `{ ... } | RolloutPolicy`) or a
        // map of service entries: a map's fields are all records, while a policy always has a
        // number (its required deadline) among them.
        // One short line each, so that a diagnostic quoting where the contract was applied
        // quotes a line a person can read.
        InputKind::Nickel => format!(
            "let {{ RolloutPolicy, .. }} = import {contract} in\n\
             let policy = import {input} in\n\
             if std.is_record policy && std.array.all std.is_record (std.record.values policy) then\n\
             \x20 policy | {{ _ | RolloutPolicy }}\n\
             else\n\
             \x20 policy | RolloutPolicy\n"
        ),
    }
}

fn build(main: Main<'_>, imports: Vec<PathBuf>) -> Result<Program<CacheImpl>, PolicyError> {
    let builder = ProgramBuilder::new().add_import_paths(imports);
    let builder = match main {
        Main::File(path) => builder.add_path(path),
        Main::Source(source, name) => builder.add_source_string(source, name),
    };
    builder
        .build()
        .map_err(|e| PolicyError::Bundle(format!("cannot load the policy: {e}")))
}

/// Lets go of a program without tearing it down. Every evaluation runs in a sandbox child that
/// exits right after (see `sandbox`), and freeing Nickel's term graph node by node cost a few
/// percent of a one-file check.
fn abandon(program: Program<CacheImpl>) {
    std::mem::forget(program);
}

enum Main<'a> {
    File(&'a Path),
    Source(String, &'a str),
}

fn export_value(
    program: &mut Program<CacheImpl>,
    format: ExportFormat,
) -> Result<Evaluated, NickelError> {
    let value = program.eval_full_for_export()?;
    serialize::validate(format, &value)
        .map_err(|e| NickelError::export_error(program.pos_table().clone(), e))?;
    let mut text = serialize::to_string(format, &value)
        .map_err(|e| NickelError::export_error(program.pos_table().clone(), e))?;
    // Nickel's CLI adds the final newline for JSON only; YAML and TOML writers end with one.
    if format == ExportFormat::Json {
        text.push('\n');
    }
    let json = serde_json::to_value(&value).unwrap_or(serde_json::Value::Null);
    Ok(Evaluated { value: json, text })
}

/// What an evaluation is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// `policy export`: exactly what `nickel export` prints (a data file gets the contract on
    /// every entry, as it always has; a Nickel file is taken as written, so the lesson's
    /// files and a contract of the student's own behave as Nickel's CLI has them).
    Export,
    /// `policy check` and every deploy: the policy is held to the contract after evaluation,
    /// whether or not it applies it itself.
    Use,
}

/// Evaluates one policy file as `nickel export --format FORMAT` would, held to the contract
/// when it is for use.
pub fn evaluate(
    path: &Path,
    format: ExportFormat,
    purpose: Purpose,
    opts: &EvalOptions,
) -> Result<Evaluated, PolicyError> {
    check_input(path, opts)?;
    let mut answers = evaluate_each_checked(&[path.to_path_buf()], format, purpose, opts);
    answers.pop().expect("one answer per file")
}

/// `evaluate` for many files that already passed `check_input`, each in its own sandbox, as
/// many at once as there are cores.
pub(super) fn evaluate_each_checked(
    paths: &[PathBuf],
    format: ExportFormat,
    purpose: Purpose,
    opts: &EvalOptions,
) -> Vec<Result<Evaluated, PolicyError>> {
    let (imports, contract) = match import_paths(opts) {
        Ok(found) => found,
        Err(e) => {
            let reason = e.to_string();
            return paths
                .iter()
                .map(|_| Err(PolicyError::Bundle(reason.clone())))
                .collect();
        }
    };
    // Asking for the core count reads cgroup files: not worth it for one file.
    let cores = match paths.len() {
        0 | 1 => 1,
        _ => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let rules = import_rules(&imports, opts);
    isolated_each(paths, opts.timeout, cores, |i| {
        let walked = match InputKind::of(&paths[i]) {
            InputKind::Nickel => imports::check(&paths[i], &rules.for_input(&paths[i]))?,
            InputKind::Data => Walked::default(),
        };
        evaluate_here(
            &paths[i],
            format,
            purpose,
            (imports.clone(), &contract),
            walked,
            opts.color,
        )
    })
}

/// The evaluation itself, run inside a sandbox child.
fn evaluate_here(
    path: &Path,
    format: ExportFormat,
    purpose: Purpose,
    (imports, contract): (Vec<PathBuf>, &Path),
    walked: Walked,
    color: bool,
) -> Result<Evaluated, PolicyError> {
    let checked = |imports, contract: &Path| {
        let source = checked_expression(path, contract, walked);
        let mut program = build(Main::Source(source, "<rollgate: checked policy>"), imports)?;
        let result = export_value(&mut program, format).map_err(|e| {
            PolicyError::Nickel(Box::new(Diagnostic::from_nickel(&program, e, color)))
        });
        abandon(program);
        result
    };
    if InputKind::of(path) == InputKind::Data {
        return checked(imports, contract);
    }
    // A Nickel file: exported as `nickel export` would first, so that a file which fails on
    // its own (a contract it applies, a syntax error) gets Nickel's own diagnostic byte for
    // byte; only a file that exports is then held to the contract it may not have applied.
    let mut program = build(Main::File(path), imports.clone())?;
    let exported = export_value(&mut program, format)
        .map_err(|e| PolicyError::Nickel(Box::new(Diagnostic::from_nickel(&program, e, color))));
    abandon(program);
    let exported = exported?;
    if purpose == Purpose::Export || walked.applies_contract {
        return Ok(exported);
    }
    let own_contract = contract_for(path, &imports, contract);
    checked(imports, &own_contract)?;
    Ok(exported)
}

/// The contract an input is held to: the bundled one for a data file; for a Nickel file, the
/// one its own import would reach (`contract_seen_from`).
fn contract_for(path: &Path, imports: &[PathBuf], bundled: &Path) -> PathBuf {
    match InputKind::of(path) {
        InputKind::Data => bundled.to_path_buf(),
        InputKind::Nickel => {
            contract_seen_from(path, imports).unwrap_or_else(|| bundled.to_path_buf())
        }
    }
}

/// The `rollout-policy.ncl` a Nickel file's own `import "rollout-policy.ncl"` would reach: the
/// one beside it, else the first on the import path (the bundled one is last there). A file that
/// applies no contract is held to this one, so a team's stricter copy (or the lab's, while a
/// student writes it) judges every file the way it judges the files that import it.
fn contract_seen_from(path: &Path, imports: &[PathBuf]) -> Option<PathBuf> {
    let beside = absolute(path).parent().map(Path::to_path_buf);
    beside
        .into_iter()
        .chain(imports.iter().cloned())
        .map(|folder| folder.join(CONTRACT_FILE))
        .find(|candidate| candidate.is_file())
}

/// Applies the Nickel function in `function` to the JSON document `argument` and returns the
/// result as JSON: how `log summary --query` runs a query written in Nickel.
pub fn evaluate_applied(
    function: &Path,
    argument: &serde_json::Value,
    opts: &EvalOptions,
) -> Result<serde_json::Value, PolicyError> {
    check_input(function, opts)?;
    let (imports, _) = import_paths(opts)?;
    let rules = import_rules(&imports, opts).for_input(function);
    let scratch = tempfile::tempdir()
        .map_err(|e| PolicyError::Bundle(format!("cannot make a scratch folder: {e}")))?;
    let argument_path = scratch.path().join("records.json");
    std::fs::write(
        &argument_path,
        serde_json::to_vec(argument).expect("JSON serializes"),
    )
    .map_err(|e| PolicyError::Bundle(format!("cannot write {}: {e}", argument_path.display())))?;
    let source = format!(
        "(import {}) (import {})",
        nickel_string(&absolute(function)),
        nickel_string(&argument_path)
    );
    let color = opts.color;
    let function_path = function.to_path_buf();
    let evaluated = isolated(function, opts.timeout, move || {
        imports::check(&function_path, &rules)?;
        let mut program = build(Main::Source(source, "<rollgate: query>"), imports)?;
        let result = export_value(&mut program, ExportFormat::Json).map_err(|e| {
            PolicyError::Nickel(Box::new(Diagnostic::from_nickel(&program, e, color)))
        });
        abandon(program);
        result
    })?;
    drop(scratch);
    Ok(evaluated.value)
}

/// Evaluates many inputs in one program, so the standard library and the contract are loaded
/// once. Returns one entry per input: `Some(Ok)` for a file that evaluated, `Some(Err)` for one
/// that failed in the batch, `None` where the batch could not decide. Callers re-check every
/// failure on its own (see `check::check_files`): batch diagnostics are not what `export` prints.
///
/// A field whose evaluation fails (a broken contract) is marked and the program goes on. Files
/// Nickel cannot parse are left out from the start. A failure while preparing the program (a
/// type or import error, a syntax error in an imported file) poisons it
/// (Nickel's cache is left half-prepared), so the batch is then rebuilt from the files still
/// undecided, leaving out the culprit: the input the diagnostic points into (a syntax error in
/// file 7 surfaces while evaluating file 0), or else the field being evaluated.
pub fn evaluate_batch(paths: &[PathBuf], opts: &EvalOptions) -> Vec<Option<Result<(), ()>>> {
    let count = paths.len();
    let Ok((imports, contract)) = import_paths(opts) else {
        return vec![None; count];
    };
    let rules = import_rules(&imports, opts);
    // The batch gets the time limit of one file: a batch that overruns it (a runaway file) is
    // abandoned, and the one-by-one pass names the file, each with its own limit.
    let budget = opts.timeout;
    let outcome = isolated(Path::new("<batch>"), budget, move || {
        // A syntax error would poison the shared program and cost a rebuild per broken file:
        // such files go straight to the lone pass.
        // So do files with a refused import: the lone pass words the refusal.
        let mut results: Vec<Option<Result<(), ()>>> = Vec::with_capacity(count);
        let mut inputs: Vec<(String, String)> = Vec::with_capacity(count);
        for p in paths {
            let walked = match InputKind::of(p) {
                InputKind::Nickel => imports::check(p, &rules.for_input(p)),
                InputKind::Data => Ok(Walked::default()),
            };
            results.push((walked.is_err() || !parses(p)).then_some(Err(())));
            inputs.push((
                absolute(p).to_string_lossy().into_owned(),
                checked_expression(
                    p,
                    &contract_for(p, &imports, &contract),
                    walked.unwrap_or_default(),
                ),
            ));
        }
        loop {
            let remaining: Vec<usize> = (0..count).filter(|i| results[*i].is_none()).collect();
            if remaining.is_empty() {
                break;
            }
            let mut source = String::from("{\n");
            for i in &remaining {
                source.push_str(&format!("  f{i} = {},\n", inputs[*i].1));
            }
            source.push('}');
            let mut program = build(
                Main::Source(source, "<rollgate: check batch>"),
                imports.clone(),
            )?;
            let mut poisoned = false;
            for &i in &remaining {
                program.field = FieldPath(vec![LocIdent::from(format!("f{i}"))]);
                match export_value(&mut program, ExportFormat::Json) {
                    Ok(_) => results[i] = Some(Ok(())),
                    // A broken contract or an unexportable value fails this field only: the
                    // virtual machine unwinds on error, so no thunk stays blackholed and the
                    // program goes on to the next field.
                    Err(NickelError::EvalError(_) | NickelError::ExportError(_)) => {
                        results[i] = Some(Err(()));
                    }
                    Err(error) => {
                        let culprit = Diagnostic::from_nickel(&program, error, false)
                            .location
                            .and_then(|at| {
                                remaining.iter().copied().find(|j| inputs[*j].0 == at.file)
                            })
                            .unwrap_or(i);
                        results[culprit] = Some(Err(()));
                        poisoned = true;
                        break;
                    }
                }
            }
            abandon(program);
            if !poisoned {
                break;
            }
        }
        Ok(results)
    });
    outcome.unwrap_or_else(|_| vec![None; count])
}

/// Whether Nickel's parser for the file's format (Nickel, JSON, YAML or TOML) accepts it on its
/// own; what a Nickel file imports is not looked at.
fn parses(path: &Path) -> bool {
    use nickel_lang_core::ast::AstAlloc;
    use nickel_lang_core::files::Files;
    use nickel_lang_core::parser::{grammar::TermParser, lexer::Lexer, ErrorTolerantParser};
    use nickel_lang_core::position::PosTable;
    use nickel_lang_core::serialize::{toml_deser, yaml};
    let Ok(source) = std::fs::read_to_string(path) else {
        return false;
    };
    let mut files = Files::empty();
    let id = files.add(path.as_os_str(), source.as_str());
    let mut positions = PosTable::new();
    match path.extension().and_then(|e| e.to_str()) {
        Some("json") => yaml::load_json_value(&mut positions, &source, Some(id)).is_ok(),
        Some("yaml" | "yml") => {
            yaml::load_yaml_value(&mut positions, &source, Some(id), yaml::Listify::Auto).is_ok()
        }
        Some("toml") => toml_deser::from_str(&mut positions, &source, id).is_ok(),
        _ => TermParser::new()
            .parse_strict(&AstAlloc::new(), id, Lexer::new(&source))
            .is_ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nickel_string_escapes_what_would_break_the_literal() {
        assert_eq!(nickel_string(Path::new("/a/b.ncl")), "\"/a/b.ncl\"");
        assert_eq!(
            nickel_string(Path::new("/we\"ird/%{x}\\.ncl")),
            "\"/we\\\"ird/\\%{x}\\\\.ncl\""
        );
    }

    #[test]
    fn the_syntax_probe_agrees_with_nickel() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        assert!(parses(&file(
            "good.ncl",
            "let x = import \"gone.ncl\" in { a = x }"
        )));
        assert!(!parses(&file("bad.ncl", "{ a = , }")));
        assert!(!parses(&file("open.ncl", "{ a = 1")));
        assert!(!parses(&dir.path().join("absent.ncl")));
        assert!(parses(&file("good.json", r#"{"svc": {"poll_ms": 100}}"#)));
        assert!(!parses(&file("bad.json", r#"{"svc": {"poll_ms": 100}"#)));
        assert!(parses(&file("good.yaml", "svc:\n  poll_ms: 100\n")));
        assert!(!parses(&file("bad.yaml", "svc:\n  poll_ms: [100\n")));
        assert!(parses(&file("good.toml", "[svc]\npoll_ms = 100\n")));
        assert!(!parses(&file("bad.toml", "[svc\npoll_ms = 100\n")));
    }

    #[test]
    fn kind_follows_the_extension() {
        assert_eq!(InputKind::of(Path::new("p.yaml")), InputKind::Data);
        assert_eq!(InputKind::of(Path::new("p.yml")), InputKind::Data);
        assert_eq!(InputKind::of(Path::new("p.toml")), InputKind::Data);
        assert_eq!(InputKind::of(Path::new("p.json")), InputKind::Data);
        assert_eq!(InputKind::of(Path::new("p.ncl")), InputKind::Nickel);
        assert_eq!(InputKind::of(Path::new("policy")), InputKind::Nickel);
    }
}
