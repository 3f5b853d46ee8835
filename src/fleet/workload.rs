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
