//! Block-style YAML for the manifests rollgate exports, written from a JSON value.
//!
//! Every string is written JSON-quoted (JSON strings are YAML strings), so `"on"`, `"0%"` or
//! `"1.10"` can never be read back as a boolean or a number; keys are written bare when they are
//! plain names (`rollgate.dev/on-stall`) and quoted otherwise. A list under a key starts at the
//! key's own indent, as Kubernetes manifests are usually written; keys come in name order.

use serde_json::Value;

/// The document for `value` (an object), each line ending in a newline.
pub fn document(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => mapping(map, 0, &mut out),
        other => {
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
    out
}

fn mapping(map: &serde_json::Map<String, Value>, indent: usize, out: &mut String) {
    for (key, value) in map {
        pad(indent, out);
        out.push_str(&key_text(key));
        out.push(':');
        nested(value, indent, indent + 2, out);
    }
}

/// Writes what follows `key:` (or `- `): a scalar on the same line, or a block below it.
/// `list_indent` is where a list's dashes go, `map_indent` where a mapping's keys go.
fn nested(value: &Value, list_indent: usize, map_indent: usize, out: &mut String) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push('\n');
            mapping(map, map_indent, out);
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            sequence(items, list_indent, out);
        }
        other => {
            out.push(' ');
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
}

fn sequence(items: &[Value], indent: usize, out: &mut String) {
    for item in items {
        pad(indent, out);
        out.push('-');
        match item {
            Value::Object(map) if !map.is_empty() => {
                // The first key shares the dash's line; the rest line up under it.
                let mut first = true;
                for (key, value) in map {
                    if first {
                        out.push(' ');
                        first = false;
                    } else {
                        pad(indent + 2, out);
                    }
                    out.push_str(&key_text(key));
                    out.push(':');
                    nested(value, indent + 2, indent + 4, out);
                }
            }
            other => nested(other, indent + 2, indent + 2, out),
        }
    }
}

fn scalar(value: &Value) -> String {
    match value {
        Value::Object(_) => "{}".into(),
        Value::Array(_) => "[]".into(),
        // Numbers, booleans, null and JSON-quoted strings are all YAML scalars as written.
        other => other.to_string(),
    }
}

fn key_text(key: &str) -> String {
    let plain = !key.is_empty()
        && key.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '/' | '-' | '_'));
    if plain {
        key.to_string()
    } else {
        Value::String(key.to_string()).to_string()
    }
}

fn pad(indent: usize, out: &mut String) {
    out.extend(std::iter::repeat_n(' ', indent));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn writes_kubernetes_style_blocks() {
        let value = json!({
            "kind": "Deployment",
            "metadata": {"name": "edge-svc", "labels": {"app.kubernetes.io/name": "edge-svc"}},
            "spec": {
                "replicas": 3,
                "template": {"spec": {"containers": [
                    {"name": "edge-svc", "ports": [{"name": "http", "containerPort": 8080}],
                     "args": ["--port", "8080"]}
                ]}},
                "empty": {},
                "none": [],
                "on": "on",
            },
        });
        // Keys come in name order (serde_json's maps are sorted), as `kubectl get -o yaml`
        // prints them.
        assert_eq!(
            document(&value),
            "kind: \"Deployment\"\n\
             metadata:\n  labels:\n    app.kubernetes.io/name: \"edge-svc\"\n  name: \"edge-svc\"\n\
             spec:\n  empty: {}\n  none: []\n  on: \"on\"\n  replicas: 3\n  template:\n    spec:\n      containers:\n      - args:\n        - \"--port\"\n        - \"8080\"\n        name: \"edge-svc\"\n        ports:\n        - containerPort: 8080\n          name: \"http\"\n"
        );
    }

    #[test]
    fn odd_keys_are_quoted() {
        assert_eq!(
            document(&json!({"0": 1, "a b": 2})),
            "\"0\": 1\n\"a b\": 2\n"
        );
    }
}
