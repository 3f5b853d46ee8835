//! Past one host: `rollgate fleet playbook` writes an Ansible playbook that rolls one version
//! across a group of hosts, each running rollgate (its gate, switch, watch and log), in the
//! waves the reviewed policy gives, so a team that outgrows one host does not retype its policy.
//!
//! How rollgate's words become Ansible's:
//! - waves: rollgate's cumulative wave sizes for the group's host count, turned into a `serial`
//!   list of batch sizes (absolute numbers: Ansible floors percentages of the whole group and
//!   repeats the last entry, so percentages cannot be passed through);
//! - the first batch is the canary: a failure there ends the play, every other host untouched;
//! - `max_failure_ratio` becomes `max_fail_percentage` (both mean "more than");
//! - hosts with `rollgate_class=required` end the whole play when they fail;
//!   `rollgate_class=left_behind` hosts are not touched;
//! - `soak_ms` is a pause after each batch, then a re-check that the batch's hosts still answer
//!   their probe (`rollgate status`).
//!
//! The policy travels inside the playbook as the JSON rollgate exported from it, so every host
//! is held to exactly what was reviewed.

pub mod argo;
pub mod export;
mod k8s;
mod nomad;
mod pod;
mod schedules;
mod types;
mod workload;
mod yaml;

use crate::defaults;
use std::path::Path;

use crate::engine::budgets::wave_sizes;
use crate::error::Error;
use crate::policy::{self, EvalOptions, RolloutSettings};

/// A policy entry an engine would refuse, and why (exported as nothing: the export fails).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{entry}`: {why}")]
pub struct Inexpressible {
    pub entry: String,
    pub why: String,
}

impl Inexpressible {
    pub fn new(entry: &str, why: impl Into<String>) -> Inexpressible {
        Inexpressible {
            entry: entry.to_string(),
            why: why.into(),
        }
    }
}

/// What a playbook is written for.
#[derive(Debug, Clone)]
pub struct PlaybookRequest<'a> {
    pub policy: &'a Path,
    /// The policy's entry (default: the service name with `-` as `_`).
    pub entry: Option<&'a str>,
    pub service: &'a str,
    pub version: &'a str,
    /// The inventory group of the service's hosts.
    pub group: &'a str,
    /// How many of the group's hosts move (left-behind ones not counted).
    pub hosts: usize,
    /// The rollgate executable on each host, when it is not `rollgate` on the PATH.
    pub rollgate: &'a str,
}

/// The most hosts a playbook is cut for (rollgate's own bound on replicas).
pub const MAX_HOSTS: usize = 10_000;

/// The batch sizes (`serial`) that move `hosts` hosts in the policy's waves.
pub fn batches(hosts: usize, percents: &[u64]) -> Vec<usize> {
    let mut previous = 0;
    wave_sizes(hosts, percents)
        .into_iter()
        .map(|cumulative| {
            let batch = cumulative - previous;
            previous = cumulative;
            batch
        })
        .collect()
}

/// `rollgate fleet playbook`: the playbook's text.
pub fn playbook(request: &PlaybookRequest, opts: &EvalOptions) -> Result<String, Error> {
    if request.hosts == 0 || request.hosts > MAX_HOSTS {
        return Err(Error::Refused(format!(
            "--hosts is {}; it must be from 1 to {MAX_HOSTS} (the group's hosts that move)",
            request.hosts
        )));
    }
    crate::host::names::check_name("service", request.service)?;
    crate::host::names::check_name("version", request.version)?;
    if request.group.is_empty()
        || !request
            .group
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(Error::Refused(format!(
            "--group {:?} must be an Ansible group name (letters, digits, '_')",
            request.group
        )));
    }
    let entry = request
        .entry
        .map(str::to_string)
        .unwrap_or_else(|| crate::engine::plan::policy_entry_for(request.service));
    let (value, settings) = policy::load_entry_value(request.policy, &entry, opts)?;
    Ok(render(request, &entry, &value, &settings))
}

fn quoted(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}

// Long on purpose: one playbook, written in the order Ansible reads it; split, its YAML would
// be spread over functions that each write half a task.
fn render(
    request: &PlaybookRequest,
    entry: &str,
    value: &serde_json::Value,
    settings: &RolloutSettings,
) -> String {
    let percents = settings.waves.clone().unwrap_or(defaults::WAVES.to_vec());
    let serial = batches(request.hosts, &percents);
    let ratio = settings.max_failure_ratio.unwrap_or(0.05);
    let fail_percentage = ratio * 100.0;
    let soak_s = settings.soak_ms.unwrap_or(0).div_ceil(1000);
    let group = request.group;
    let policy_json = serde_json::to_string(&serde_json::json!({ entry: value }))
        .expect("a JSON value serializes");
    let serial_text = serial
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let soak = if soak_s == 0 {
        String::new()
    } else {
        format!(
            "
    - name: soak_ms ({soak_ms} ms, in whole seconds) after the batch
      ansible.builtin.pause:
        seconds: {soak_s}
      run_once: true

    - name: the batch's hosts still answer their probe on {version}
      ansible.builtin.command:
        argv: [\"{{{{ rollgate_bin }}}}\", status, --format, json, --root, \"{{{{ rollgate_root }}}}\"]
      register: rechecked
      changed_when: false
      failed_when: >-
        rechecked.rc != 0
        or (rechecked.stdout | from_json).live is none
        or (rechecked.stdout | from_json).live.version != {version_q}
        or not (rechecked.stdout | from_json).live.answering
",
            soak_ms = settings.soak_ms.unwrap_or(0),
            version = request.version,
            version_q = quoted(request.version),
        )
    };
    format!(
        "# Written by `rollgate fleet playbook` from {policy} (entry {entry}): {service} {version}
# across the {hosts} moving hosts of group {group}, in batches of {serial_text}
# (waves {percents:?} %), at most {fail_percentage}% failed per batch.
# Each host needs rollgate and its root (inventory: rollgate_root, and rollgate_ports (a
# range: rollgate picks the port that is not live, so one inventory serves every release) or
# rollgate_port; a host whose root has replicas.json, or with rollgate_replicas=true, is moved
# by `rollgate rollout` over rollgate_ports; optional rollgate_class = required | best_effort
# | left_behind, optional rollgate_bin). Run: ansible-playbook -i INVENTORY THIS_FILE
- name: sort the hosts of {group} by their rollgate class
  hosts: {group}
  gather_facts: false
  tasks:
    - name: group by class
      ansible.builtin.group_by:
        key: \"rollgate_{{{{ rollgate_class | default('best_effort') }}}}\"

    - name: the play was cut for {hosts} moving hosts
      ansible.builtin.assert:
        that: (groups[{group_q}] | difference(groups['rollgate_left_behind'] | default([]))) | length == {hosts}
        fail_msg: >-
          this playbook moves {hosts} hosts of {group}; the inventory has
          {{{{ (groups[{group_q}] | difference(groups['rollgate_left_behind'] | default([]))) | length }}}}
          (not counting left-behind ones): write it again with that --hosts
      run_once: true

- name: the canary, then the waves
  hosts: \"{group}:!rollgate_left_behind\"
  gather_facts: false
  serial: [{serial_text}]
  max_fail_percentage: {fail_percentage}
  vars:
    rollgate_bin: {rollgate}
    rollgate_policy: {policy_json}
  tasks:
    - name: rollgate fleet move {service} {version} (keeps the policy in the root; a rollout where the root runs replicas, a deploy otherwise)
      ansible.builtin.command:
        argv: >-
          {{{{ [rollgate_bin, 'fleet', 'move', {service_q}, {version_q}, '--root', rollgate_root,
          '--policy-entry', {entry_q}]
          + (['--ports', rollgate_ports | string] if rollgate_ports is defined
          else ['--port', rollgate_port | string])
          + (['--replicas'] if rollgate_replicas | default(false) | bool else []) }}}}
        stdin: \"{{{{ rollgate_policy | to_json }}}}\"
      register: deployed
      ignore_errors: true

    - name: a required host that did not take {version} ends the play on every host
      ansible.builtin.fail:
        msg: \"required host {{{{ inventory_hostname }}}}: rollgate exited {{{{ deployed.rc }}}}: {{{{ deployed.stderr | default('') }}}}\"
      when: deployed is failed and (rollgate_class | default('best_effort')) == 'required'
      any_errors_fatal: true

    - name: the canary did not take {version}; no other host is touched
      ansible.builtin.fail:
        msg: \"canary {{{{ inventory_hostname }}}}: rollgate exited {{{{ deployed.rc }}}}: {{{{ deployed.stderr | default('') }}}}\"
      when: deployed is failed and inventory_hostname in ansible_play_hosts_all[:{canary}]
      any_errors_fatal: true

    - name: a host that did not take {version} counts against its batch
      ansible.builtin.fail:
        msg: \"{{{{ inventory_hostname }}}}: rollgate exited {{{{ deployed.rc }}}}: {{{{ deployed.stderr | default('') }}}}\"
      when: deployed is failed
{soak}",
        policy = request.policy.display(),
        service = request.service,
        version = request.version,
        hosts = request.hosts,
        group_q = quoted(group),
        rollgate = quoted(request.rollgate),
        service_q = quoted(request.service),
        version_q = quoted(request.version),
        entry_q = quoted(entry),
        canary = serial.first().copied().unwrap_or(1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Ansible's own batching (`PlaybookExecutor._get_serialized_batches`): each entry of
    /// `serial` in turn (the last one repeated) takes that many of the remaining hosts.
    fn ansible_batches(hosts: usize, serial: &[usize]) -> Vec<usize> {
        let mut left = hosts;
        let mut out = Vec::new();
        let mut item = 0;
        while left > 0 {
            let size = serial.get(item).copied().unwrap_or(0);
            if size == 0 {
                out.push(left);
                break;
            }
            let taken = size.min(left);
            out.push(taken);
            left -= taken;
            item = (item + 1).min(serial.len().saturating_sub(1));
        }
        out
    }

    #[test]
    fn ten_hosts_in_the_default_waves_move_one_one_three_five() {
        assert_eq!(batches(10, &defaults::WAVES), [1, 1, 3, 5]);
        assert_eq!(ansible_batches(10, &[1, 1, 3, 5]), [1, 1, 3, 5]);
        // Ansible repeats the last entry: a list that stops short would keep going.
        assert_eq!(ansible_batches(10, &[1, 2]), [1, 2, 2, 2, 2, 1]);
    }

    proptest! {
        #[test]
        fn ansibles_batching_of_the_serial_gives_rollgates_waves(
            hosts in 1usize..=500,
            percents in proptest::collection::vec(1u64..=100, 1..6),
        ) {
            let serial = batches(hosts, &percents);
            let cumulative: Vec<usize> = ansible_batches(hosts, &serial)
                .into_iter()
                .scan(0, |sum, batch| { *sum += batch; Some(*sum) })
                .collect();
            prop_assert_eq!(cumulative, wave_sizes(hosts, &percents));
        }
    }
}
