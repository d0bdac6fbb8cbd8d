//! `family_from`: a space that takes another space's [family], [symbols] and [timeouts] instead of
//! writing its own (the experiment spaces take the Hopper space's).
use super::load::{FamilyFile, SpaceFile};
use super::FamilySource;
use crate::error::Result;
use crate::model::config;
use indexmap::IndexMap;
use serde::Deserialize;
use std::path::Path;

/// What `family_from` reads of the space it names: the rest of that file is its own business.
#[derive(Debug, Deserialize)]
struct FamilySourceFile {
    family: Option<FamilyFile>,
    family_from: Option<toml::Value>,
    symbols: Option<IndexMap<String, i64>>,
    timeouts: Option<crate::model::config::Timeouts>,
}

/// A space's [family], [symbols] and [timeouts]: its own, or those of the space `family_from`
/// names (the space's own [timeouts] still win).
pub(super) struct FamilyOrigin {
    pub(super) family: FamilyFile,
    pub(super) symbols: IndexMap<String, i64>,
    pub(super) timeouts: Option<config::Timeouts>,
    pub(super) source: Option<FamilySource>,
}

/// Where the space in `path` takes its family from; a wrong `family_from` is an error at its line.
pub(super) fn family_origin(path: &Path, text: &str, file: &SpaceFile) -> Result<FamilyOrigin> {
    let from = match (&file.family, &file.family_from) {
        (Some(family), None) => {
            return Ok(FamilyOrigin {
                family: family.clone(),
                symbols: file.symbols.clone().unwrap_or_default(),
                timeouts: checked_timeouts(path, text, &file.timeouts)?,
                source: None,
            })
        }
        (Some(_), Some(_)) => {
            return Err(config::config_error_at_key(
                path,
                text,
                "family_from",
                "a space writes its own [family] or takes another space's with family_from, not both".into(),
            ))
        }
        (None, None) => {
            return Err(config::config_error_at_key(
                path,
                text,
                "name",
                "a space needs a [family] table (the kernel, its entry points, the launch contract), or `family_from = \"<space>.toml\"` naming a space beside it whose family it takes".into(),
            ))
        }
        (None, Some(from)) => from,
    };
    let at_key = |key: &str, message: String| config::config_error_at_key(path, text, key, message);
    if file.symbols.is_some() {
        return Err(at_key(
            "symbols",
            format!(
                "the symbols come with the family from `{}`: set them there",
                from.display()
            ),
        ));
    }
    let beside = from.components().count() > 0
        && from
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
    if !beside {
        return Err(at_key(
            "family_from",
            format!(
                "`{}` must name a space in this space's folder (or below it), relative to it, with no `..`",
                from.display()
            ),
        ));
    }
    let source_path = path.parent().unwrap_or(Path::new("")).join(from);
    let source_text = std::fs::read_to_string(&source_path).map_err(|e| {
        at_key(
            "family_from",
            format!("cannot read {}: {e}", source_path.display()),
        )
    })?;
    let source: FamilySourceFile = config::parse_toml(&source_path, &source_text)?;
    let family = match (source.family, source.family_from) {
        (Some(family), None) => family,
        (_, Some(_)) => {
            let named = source_path.display();
            return Err(at_key(
                "family_from",
                format!("{named} takes its family with family_from too: name the space that writes the [family]"),
            ));
        }
        (None, None) => {
            return Err(at_key(
                "family_from",
                format!("{} has no [family] table", source_path.display()),
            ))
        }
    };
    let timeouts = match &file.timeouts {
        Some(_) => checked_timeouts(path, text, &file.timeouts)?,
        None => checked_timeouts(&source_path, &source_text, &source.timeouts)?,
    };
    Ok(FamilyOrigin {
        family,
        symbols: source.symbols.unwrap_or_default(),
        timeouts,
        source: Some(FamilySource {
            path: source_path,
            text: source_text,
        }),
    })
}

/// A space's [timeouts], checked against the file they were written in.
fn checked_timeouts(
    path: &Path,
    text: &str,
    timeouts: &Option<config::Timeouts>,
) -> Result<Option<config::Timeouts>> {
    if let Some(t) = timeouts {
        t.check("timeouts", path, text)?;
    }
    Ok(timeouts.clone())
}
