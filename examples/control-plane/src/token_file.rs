//! The token file, followed: read at start, then again whenever it changes, so that a line
//! removed revokes its token without a restart and a line added takes effect at once.
//!
//! The file is checked every [`CHECK_INTERVAL`] by its modification time, size and inode (a
//! Kubernetes Secret volume replaces the file through a symlink, which changes the inode).
//! A new version that does not parse is refused as a whole: the last good grants stay, the
//! error is logged and counted (`meshkit_token_file_reloads_total{result="refused"}`), and
//! the next change is tried again. A file that others than its owner and group may read is
//! warned about at each load: whoever reads it holds its identities.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::ca::{CaConfigError, TokenGrants};
use crate::metrics::CaMetrics;

/// How often the file is checked for a change.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// What tells one version of the file from the next without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

/// The grants of `path` as now, and a receiver that follows them; call [`follow`] to keep
/// it current.
///
/// # Errors
///
/// When the file cannot be read or parsed now.
pub(crate) fn load(
    path: &Path,
) -> Result<(watch::Sender<Arc<TokenGrants>>, Option<Stamp>), CaConfigError> {
    let stamp = stamp(path);
    let grants = TokenGrants::load(path)?;
    warn_if_readable_by_others(path);
    tracing::info!(path = %path.display(), tokens = grants.len(), "token file loaded");
    Ok((watch::Sender::new(Arc::new(grants)), stamp))
}

/// Keeps `grants` at the contents of `path`, checking it every [`CHECK_INTERVAL`] until
/// `stop` is set.
pub(crate) async fn follow(
    path: PathBuf,
    grants: watch::Sender<Arc<TokenGrants>>,
    mut seen: Option<Stamp>,
    metrics: CaMetrics,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(CHECK_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
        let now = stamp(&path);
        if now == seen {
            continue;
        }
        let loaded = TokenGrants::load(&path);
        // A file that changed while it was read (a writer between its truncate and its
        // write) is read again at the next tick, never applied half written.
        if stamp(&path) != now {
            continue;
        }
        seen = now;
        match loaded {
            Ok(new) => {
                warn_if_readable_by_others(&path);
                let changed = **grants.borrow() != new;
                metrics.token_file_reload(true);
                if changed {
                    tracing::info!(path = %path.display(), tokens = new.len(), "token file changed; new grants apply to every call from now on");
                    grants.send_replace(Arc::new(new));
                }
            }
            Err(e) => {
                metrics.token_file_reload(false);
                tracing::error!(error = %e, "token file refused; the last good grants stay");
            }
        }
    }
}

fn stamp(path: &Path) -> Option<Stamp> {
    let meta = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
    #[cfg(not(unix))]
    let inode = 0;
    Some(Stamp {
        modified: meta.modified().ok(),
        len: meta.len(),
        inode,
    })
}

/// Whether users other than the file's owner and group may read `path` (always `false` where
/// the platform has no such bits).
pub fn readable_by_others(path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o004 != 0)
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        false
    }
}

fn warn_if_readable_by_others(path: &Path) {
    if readable_by_others(path) {
        tracing::warn!(
            path = %path.display(),
            "the token file is readable by every user of this machine: whoever reads it holds its identities; chmod o-r it"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn a_file_others_may_read_is_told_apart() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("meshkit-token-mode-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens");
        std::fs::write(&path, "t spiffe://cluster.local/ns/a/sa/b\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(!readable_by_others(&path));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(readable_by_others(&path));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
