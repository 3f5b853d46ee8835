//! What every engine's exporter shares: the workload a policy does not describe, one entry's
//! document, and what no engine can say. Names nothing else of the fleet, so the exporters
//! (`k8s`, `argo`, `nomad`, `pod`) and `export`, which picks one, all stand on it.

use crate::policy::RolloutSettings;

/// What the exported objects need that a policy does not say.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The container image (Kubernetes and Argo); without it the object is a fragment to merge
    /// into one that names its image.
    pub image: Option<String>,
    /// The port the service listens on: the container's `http` port, which the probe checks,
    /// and `PORT` in its environment, as rollgate gives it to a release.
    pub port: u16,
    /// Refuse to export a policy that would lose something.
    pub strict: bool,
    /// The release's Procfile lines (`--procfile`), in its order: what each process type runs.
    /// None: the web process is the image's own command and the policy may name no other type.
    pub procfile: Option<Vec<ProcessLine>>,
}

/// One Procfile line: a process type and its command (run by `/bin/sh -c`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessLine {
    pub name: String,
    pub command: String,
}

impl Workload {
    /// What type `name` runs, when the Procfile given says.
    pub fn command_of(&self, name: &str) -> Option<&str> {
        self.procfile
            .iter()
            .flatten()
            .find(|line| line.name == name)
            .map(|line| line.command.as_str())
    }
}

/// A Procfile command as a container runs it.
pub fn shell(command: &str) -> serde_json::Value {
    serde_json::json!(["/bin/sh", "-c", command])
}

/// One entry's document, and what of the entry it could not express.
#[derive(Debug)]
pub struct Document {
    pub text: String,
    pub lost: Vec<String>,
}

/// What none of the engines can say, whatever it is: rollgate's own steps around a release.
pub fn lost_everywhere(settings: &RolloutSettings, engine: &str) -> Vec<String> {
    let mut lost = Vec::new();
    if let Some(hooks) = &settings.hooks {
        let named: Vec<&str> = [
            ("pre_deploy", hooks.pre_deploy.is_some()),
            ("post_promote", hooks.post_promote.is_some()),
            ("post_rollback", hooks.post_rollback.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        if !named.is_empty() {
            lost.push(format!(
                "hooks ({}): {engine} runs no rollgate hooks",
                named.join(", ")
            ));
        }
    }
    lost
}
