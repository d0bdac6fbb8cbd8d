//! What judges an edit comes from HEAD: the policies and the space a step, `judge`, MCP or an agent
//! session loaded (with the space its family comes from) must be, byte for byte, the files HEAD's
//! tree holds. A space written under `runs/`, left untracked, or changed in the working tree is
//! refused by name: an agent could write any of those, and a space limited to the shapes where its
//! edit wins turns a loss into a win.
use crate::error::{Error, Result};
use crate::run::shared::Project;
use std::path::Path;

/// Refuse unless the policies and the space `project` holds (the texts it was loaded from, so no
/// later write can slip between the check and the use) are HEAD's.
pub(crate) fn refuse_rules_not_at_head(
    project: &Project,
    root: &Path,
    repo: &git2::Repository,
) -> Result<()> {
    let head = repo
        .head()
        .and_then(|h| h.peel_to_tree())
        .map_err(|e| Error::BadInput(format!("HEAD: {}", e.message())))?;
    let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let in_repository = |p: &Path| {
        let p = canonical(p);
        p.strip_prefix(canonical(root))
            .map(Path::to_path_buf)
            .unwrap_or(p)
    };
    // The space's family file too, when it takes another space's with family_from: an edited
    // family is an edited space.
    let spaces = project
        .space
        .sources()
        .into_iter()
        .enumerate()
        .map(|(i, (path, text))| {
            let what = if i == 0 {
                "the space"
            } else {
                "the space its family comes from"
            };
            (in_repository(path), text, what)
        });
    let loaded = std::iter::once((
        Path::new("policies.toml").to_path_buf(),
        project.policies_text.as_str(),
        "the policies",
    ))
    .chain(spaces);
    let mut refused = Vec::new();
    for (path, text, what) in loaded {
        let at_head = head
            .get_path(&path)
            .ok()
            .and_then(|e| repo.find_blob(e.id()).ok())
            .map(|b| b.content().to_vec());
        let why = match at_head {
            Some(bytes) if bytes == text.as_bytes() => continue,
            Some(_) => "differs from HEAD's",
            None if path.is_absolute() || path.starts_with("..") => "lies outside the repository",
            None if path.starts_with("runs") => "lies under runs/, which git does not hold",
            None => "is not in HEAD's tree",
        };
        refused.push(format!("{what} {} {why}", path.display()));
    }
    if refused.is_empty() {
        return Ok(());
    }
    Err(Error::BadInput(format!(
        "{}: an edit is judged only by the policies and the space HEAD holds, which no agent can \
         rewrite; commit them first, or pass a space HEAD has with --space",
        refused.join("; ")
    )))
}
