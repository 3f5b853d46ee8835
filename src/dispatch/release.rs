//! `release ...`: installing, listing, pruning, signing and verifying releases; and
//! `schedules ...`, what a release's policy runs on a clock.

use rollgate::error::Error;
use rollgate::release;
use rollgate::render::table::Layout;

use super::printed;
use crate::cli::{ReleaseCommand, SchedulesCommand};

/// `rollgate release ...`: exit 0, 1 when refused or failed (the reason first), 2 on usage.
// About 100 lines on purpose: one arm per `release` command, each unpacking its words into
// one call.
pub fn run_release(command: ReleaseCommand) -> Result<u8, Error> {
    let now = chrono::Utc::now();
    let result = match command {
        ReleaseCommand::List {
            target,
            format,
            wide,
        } => {
            return printed(rollgate::commands::releases::list(
                &target.root,
                format,
                Layout::of_stdout(wide),
            )?)
        }
        ReleaseCommand::Prune {
            target,
            keep,
            dry_run,
        } => {
            let pruned = rollgate::commands::releases::prune(&target.root, keep, dry_run)?;
            return printed(rollgate::commands::releases::said(&pruned, dry_run));
        }
        ReleaseCommand::Rm {
            version,
            target,
            dry_run,
        } => {
            let removed = rollgate::commands::releases::remove(&target.root, &version, dry_run)?;
            return printed(rollgate::commands::releases::said(&removed, dry_run));
        }
        ReleaseCommand::Add {
            service,
            version,
            source,
            target,
            manifest,
            max_bytes,
            max_entries,
        } => {
            let request = release::install::Request {
                root: &target.root,
                service: &service,
                version: &version,
                source: &source,
                manifest: manifest.as_deref(),
                now: now.timestamp_millis() as f64 / 1000.0,
                max_bytes,
                max_entries,
            };
            return printed(installed_words(
                &release::install::add(&request)?,
                &target.root,
                &service,
                &version,
            ));
        }
        ReleaseCommand::Keygen { out } => release::keys::generate(&out)
            .map(|(pin, public)| {
                format!(
                    "{pin}\nkey: {} (keep it offline)\npublic key: {}\n",
                    out.display(),
                    public.display()
                )
            })
            .map_err(Error::from),
        ReleaseCommand::Sign {
            dir,
            service,
            version,
            sequence,
            expires,
            key,
            cosigners,
        } => release::parse_duration(&expires)
            .map_err(|e| Error::Invalid(e.to_string()))
            .and_then(|expires_in| {
                release::sign(&release::SignRequest {
                    dir: &dir,
                    service: &service,
                    version: &version,
                    sequence,
                    expires_in,
                    key: &key,
                    cosigners: &cosigners,
                    now,
                })
                .map(|path| format!("signed: {}\n", path.display()))
            }),
        ReleaseCommand::Cosign { manifest, key } => release::cosign(&manifest, &key)
            .map(|kid| format!("cosigned by {kid}: {}\n", manifest.display())),
        ReleaseCommand::Verify {
            manifest,
            pins,
            threshold,
            dir,
            service,
            at,
        } => {
            let trust = release::Trust { pins, threshold };
            let at = at
                .as_deref()
                .map(release::parse_time)
                .transpose()
                .map_err(|e| Error::Refused(format!("--at: {e}")))?
                .unwrap_or(now);
            trust.check()?;
            release::verify(&manifest, &trust, at, service.as_deref(), dir.as_deref())
                .map(|v| {
                    format!(
                        "verified: {} {} sequence {} (manifest sha256 {})\n",
                        v.body.service, v.body.version, v.body.sequence, v.manifest_sha256
                    )
                })
                .map_err(|refusal| Error::Invalid(format!("refused: {refusal}")))
        }
    };
    printed(result?)
}

/// What `release add` says of the release it installed (or found installed).
pub fn installed_words(
    installed: &release::install::Installed,
    root: &std::path::Path,
    service: &str,
    version: &str,
) -> String {
    match installed {
        release::install::Installed::New(record) => {
            // The whole tree's digest (what a manifest pins), and an image release's image.
            let image = rollgate::host::container::ImageRelease::of_release(
                &root.join("releases").join(version),
            )
            .ok()
            .flatten()
            .map_or_else(String::new, |image| format!("; image {}", image.image));
            format!(
                "installed: {service} {version} ({} file{}, {} bytes, sha256 {}; tree sha256 {}{image})\n",
                record.files,
                if record.files == 1 { "" } else { "s" },
                record.size,
                record.sha256,
                record.tree_sha256
            )
        }
        release::install::Installed::Already(record) => format!(
            "already installed: {service} {version} (sha256 {})\n",
            record.sha256
        ),
    }
}

/// `rollgate schedules list|run`: list exits 0; run exits as the run did (2 when refused).
pub fn run_schedules(command: SchedulesCommand) -> Result<u8, Error> {
    match command {
        SchedulesCommand::List {
            target,
            format,
            wide,
        } => printed(rollgate::commands::schedules::list(
            &target.root,
            format,
            Layout::of_stdout(wide),
        )?),
        SchedulesCommand::Run {
            service,
            name,
            target,
        } => rollgate::commands::schedules::run_now(&target.root, &service, &name),
    }
}
