//! The command line, defined once: every flag with its help text. `main` only dispatches.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::policy::check::CheckFormat;
use crate::policy::ExportAs;

#[derive(Debug, Parser)]
#[command(
    name = "rollgate",
    version,
    about = "Make a release prove itself before it goes live.",
    long_about = "rollgate checks rollout policies against Nickel contracts, deploys a release \
beside the live one and switches only once it is ready, and answers questions from the deploy log.",
    after_help = "Examples:
  rollgate demo                                   deploy four sample releases and show the log
  rollgate policy check policies/*.ncl            refuse bad policies in CI
  rollgate deploy edge-svc 8081 v2 --root /srv/edge --policy policy.ncl
  rollgate log summary /srv/edge/deploy.log

Exit codes: 0 success; 1 refused policy, rolled-back deploy or failed check;
2 usage error or deploy refused before anything started; 3 deploy escalated."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check and export rollout policies (Nickel contracts, evaluated in-process).
    #[command(subcommand, after_help = "Examples:
  rollgate policy export contracts/policy.ncl
  rollgate policy check --format github policies/*.ncl
  rollgate policy contract > rollout-policy.ncl")]
    Policy(PolicyCommand),
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Evaluate a policy and print it as `nickel export` would.
    #[command(after_help = "Examples:
  rollgate policy export contracts/policy.ncl
  rollgate policy export contracts/policy.ncl --format yaml
  rollgate policy export contracts/policy.ncl --format k8s > edge-svc-patch.yaml

`import \"rollout-policy.ncl\"` resolves to, in order: the importing file's folder, each
--import-path, each folder of NICKEL_IMPORT_PATH, then the contract bundled in rollgate.
JSON, YAML and TOML files are maps of service name to policy; the bundled RolloutPolicy
contract is applied to every entry.

Exit codes: 0 exported; 1 the policy was refused (Nickel's diagnostic on stderr); 2 usage.")]
    Export {
        /// The policy file (.ncl, or .json/.yaml/.yml/.toml).
        file: PathBuf,
        /// Output format. `k8s` gives Deployment fields to merge, one YAML document per service.
        #[arg(long, short, value_enum, default_value = "json")]
        format: ExportAs,
        #[command(flatten)]
        eval: EvalArgs,
    },
    /// Check many policy files in one process: one line per file, then a total.
    #[command(after_help = "Examples:
  rollgate policy check policies/*.ncl
  rollgate policy check --format github policies/*.ncl policies/*.yaml
  rollgate policy check --format json policy.ncl | jq .

Exit codes: 0 every file passed; 1 at least one failed; 2 usage.")]
    Check {
        /// Policy files (.ncl, .json, .yaml, .yml, .toml).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Report format.
        #[arg(long, short, value_enum, default_value = "text")]
        format: CheckFormat,
        #[command(flatten)]
        eval: EvalArgs,
    },
    /// Print the bundled RolloutPolicy contract.
    Contract,
}

/// How policies are evaluated; shared by every command that reads one.
#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    /// Extra folder to look up imports in (repeatable), as Nickel's `--import-path`.
    #[arg(long = "import-path", short = 'I', value_name = "DIR")]
    pub import_paths: Vec<PathBuf>,
    /// Give up on an evaluation after this many milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// Refuse policy files larger than this.
    #[arg(long, value_name = "BYTES", default_value_t = 10 << 20)]
    pub max_file_bytes: u64,
}
