//! The CA files on disk: written atomically with their modes, checked when read.

use std::fs;
use std::io::{self, Write as _};
use std::path::Path;

use super::CaLoadError;

#[cfg(unix)]
pub(super) fn warn_if_exposed(key_path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    if let Ok(meta) = fs::metadata(key_path) {
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            tracing::warn!(
                path = %key_path.display(),
                mode = format_args!("{mode:o}"),
                "the CA private key file is readable by group or others; chmod 600 it"
            );
        }
    }
}

#[cfg(not(unix))]
pub(super) fn warn_if_exposed(_key_path: &Path) {}

/// Writes `contents` to a new temporary file next to `path` with `mode`, syncs it, renames it
/// over `path` and syncs the folder.
pub(super) fn write_atomically(
    path: &Path,
    contents: String,
    mode: u32,
) -> Result<(), CaLoadError> {
    let write_err = |source| CaLoadError::Write {
        path: path.to_owned(),
        source,
    };
    let name = path.file_name().ok_or_else(|| {
        write_err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the path names no file",
        ))
    })?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    create_dir(dir).map_err(write_err)?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{:016x}",
        name.to_string_lossy(),
        std::process::id(),
        fastrand::u64(..)
    ));
    let result = write_new(&tmp, contents.as_bytes(), mode).and_then(|()| fs::rename(&tmp, path));
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(write_err)?;
    // The rename is durable once the folder is; a failure here leaves a complete file.
    if let Ok(dir) = fs::File::open(dir) {
        let _ = dir.sync_all();
    }
    Ok(())
}

#[cfg(unix)]
fn write_new(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    // The umask may have removed bits of `mode` (never added any): set it exactly.
    file.set_permissions(fs::Permissions::from_mode(mode))?;
    file.write_all(contents)?;
    file.sync_all()
}

#[cfg(not(unix))]
fn write_new(path: &Path, contents: &[u8], _mode: u32) -> io::Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    file.write_all(contents)?;
    file.sync_all()
}

#[cfg(unix)]
fn create_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

#[cfg(not(unix))]
fn create_dir(dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)
}
