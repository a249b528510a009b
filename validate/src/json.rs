//! One value of a JSON document by a JSON pointer (`/a/b/0`): what the GPU experiment's
//! script (`experiments/validate-h200/run.sh`) reads between its `ft` calls, where the
//! machine has no `jq`. The document is read within `ft_model::limits::MAX_PROFILE_BYTES`.

use std::path::Path;

use crate::error::{Result, ValidateError};

/// The value at `pointer` (RFC 6901, as `serde_json::Value::pointer` reads it) of the JSON
/// file `file`; errors name the file and the pointer.
pub fn value_at(file: &Path, pointer: &str) -> Result<serde_json::Value> {
    let text = ft_model::limits::read_bounded(file, ft_model::limits::MAX_PROFILE_BYTES).map_err(
        |source| ValidateError::Read {
            path: file.display().to_string(),
            source,
        },
    )?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|source| ValidateError::NotJson {
            path: file.display().to_string(),
            source,
        })?;
    v.pointer(pointer).cloned().ok_or_else(|| {
        ValidateError::invalid(
            file.display().to_string(),
            format!("no value at '{pointer}' (a JSON pointer: '/' before each key or index)"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pointer_reads_keys_and_indices_and_names_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("r.json");
        std::fs::write(&file, r#"{"a": {"b": [1.5, "x"]}, "c/d": true}"#).unwrap();
        assert_eq!(value_at(&file, "/a/b/0").unwrap(), serde_json::json!(1.5));
        assert_eq!(value_at(&file, "/a/b/1").unwrap(), serde_json::json!("x"));
        assert_eq!(value_at(&file, "/c~1d").unwrap(), serde_json::json!(true));
        assert_eq!(
            value_at(&file, "").unwrap()["a"]["b"][0],
            serde_json::json!(1.5)
        );
        let e = value_at(&file, "/a/z").unwrap_err().to_string();
        assert!(
            e.contains("r.json") && e.contains("no value at '/a/z'"),
            "{e}"
        );
        // Without the leading '/', no key is found: the error says how a pointer is written.
        let e = value_at(&file, "a").unwrap_err().to_string();
        assert!(e.contains("'/' before each key"), "{e}");
    }

    #[test]
    fn a_file_that_is_not_json_or_not_there_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bad.json");
        std::fs::write(&file, "{not json").unwrap();
        let e = value_at(&file, "/a").unwrap_err().to_string();
        assert!(e.contains("bad.json is not JSON"), "{e}");
        let e = value_at(&dir.path().join("none.json"), "/a")
            .unwrap_err()
            .to_string();
        assert!(e.contains("reading") && e.contains("none.json"), "{e}");
    }
}
