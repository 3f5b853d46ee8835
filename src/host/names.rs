//! Names that become paths (services, versions): one check, for the command line and for every
//! value read back from a state file.

use super::fault::Fault;

/// Versions and service names become path components under the root: refuse anything that
/// could climb out of it or hide (`..`, `/`, leading dot, control characters).
pub fn check_name(kind: &str, name: &str) -> Result<(), Fault> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+');
    let refused = |why: String| {
        Err(Fault::Name {
            kind: kind.to_string(),
            name: name.to_string(),
            why,
        })
    };
    if name.is_empty() {
        return refused(format!("the {kind} name is empty"));
    }
    if name.len() > 128 {
        return refused(format!("the {kind} name is longer than 128 characters"));
    }
    if name.starts_with('.') {
        return refused(format!(
            "{kind} `{name}` starts with a dot (`..` and hidden names are refused)"
        ));
    }
    if let Some(bad) = name.chars().find(|c| !allowed(*c)) {
        return refused(format!(
            "{kind} `{}` contains {bad:?}; allowed are letters, digits, `.`, `_`, `-` and `+`",
            name.escape_debug()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_name;

    #[test]
    fn names_that_could_leave_their_folder_are_refused() {
        assert!(check_name("version", "v1.2.3-rc+7").is_ok());
        for bad in ["", "..", ".", ".hidden", "a/b", "../v1", "v 1", "v\n1"] {
            assert!(check_name("version", bad).is_err(), "{bad:?}");
        }
        assert!(check_name("version", "")
            .unwrap_err()
            .to_string()
            .contains("empty"));
    }
}
