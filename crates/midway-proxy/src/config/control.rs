//! `[control]`: where the control socket (`midway status`, drain, close) listens. Absent, it
//! listens at the default path; `enabled = false` or `socket = ""` turns it off.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::validate::Validator;
use super::{ConfigError, FileControl};

/// The socket's path when `[control]` does not name one and systemd gave the service no
/// runtime directory (`RuntimeDirectory=midway` gives `/run/midway` too, as
/// `$RUNTIME_DIRECTORY`).
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/midway/control.sock";
/// The socket's file name in `$RUNTIME_DIRECTORY`.
pub const CONTROL_SOCKET_NAME: &str = "control.sock";
/// A Unix socket's path holds at most 107 bytes (`sun_path` is 108 with its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// The control socket a proxy opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlConfig {
    /// Where it listens.
    pub socket: PathBuf,
    /// Written in the file: a socket that cannot be opened stops the start. The default path
    /// is best effort (a warning), since a midway run by hand or by a test as a user without
    /// `/run/midway` must still start.
    pub explicit: bool,
}

/// The default socket path: in `runtime_directory` (systemd's `$RUNTIME_DIRECTORY`, the first
/// of a colon-separated list) when set, else [`DEFAULT_CONTROL_SOCKET`].
pub fn default_control_socket(runtime_directory: Option<&OsStr>) -> PathBuf {
    let first = runtime_directory
        .and_then(|dirs| dirs.to_str())
        .and_then(|dirs| dirs.split(':').next())
        .filter(|dir| !dir.is_empty());
    match first {
        Some(dir) => Path::new(dir).join(CONTROL_SOCKET_NAME),
        None => PathBuf::from(DEFAULT_CONTROL_SOCKET),
    }
}

/// Stage 3 of `[control]`; `runtime_directory` is `$RUNTIME_DIRECTORY` (passed in, so the
/// check itself reads no environment).
pub(super) fn control(
    v: &Validator<'_>,
    file: Option<FileControl>,
    runtime_directory: Option<&OsStr>,
) -> Result<Option<ControlConfig>, ConfigError> {
    let file = file.unwrap_or_default();
    if file.enabled == Some(false) {
        return Ok(None);
    }
    let (socket, explicit) = match file.socket {
        Some(path) if path.as_os_str().is_empty() => return Ok(None),
        Some(path) => (path, true),
        None => (default_control_socket(runtime_directory), false),
    };
    if !socket.is_absolute() {
        return Err(v.invalid(
            "control.socket",
            format!(
                "{} is relative; give an absolute path, e.g. socket = \"{DEFAULT_CONTROL_SOCKET}\"",
                socket.display()
            ),
        ));
    }
    if socket.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(v.invalid(
            "control.socket",
            format!(
                "{} is longer than the {MAX_SOCKET_PATH} bytes a Unix socket's path may have; choose a shorter path",
                socket.display()
            ),
        ));
    }
    if socket.file_name().is_none() {
        return Err(v.invalid(
            "control.socket",
            format!(
                "{} names no file; e.g. socket = \"{DEFAULT_CONTROL_SOCKET}\"",
                socket.display()
            ),
        ));
    }
    Ok(Some(ControlConfig { socket, explicit }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_config;

    const LISTENER: &str = "[proxy]\nallowed_clients = [\"127.0.0.1\"]\n\
        [[listeners]]\nname = \"fwd\"\nmode = \"forward\"\nlisten = \"127.0.0.1:0\"\n\
        target = \"127.0.0.1:5201\"\n";

    fn with(control: &str) -> Result<Option<ControlConfig>, ConfigError> {
        parse_config(&format!("{LISTENER}{control}"), "<test>").map(|c| c.control)
    }

    #[test]
    fn default_path_follows_the_runtime_directory() {
        assert_eq!(
            default_control_socket(None),
            PathBuf::from(DEFAULT_CONTROL_SOCKET)
        );
        assert_eq!(
            default_control_socket(Some(OsStr::new("/run/midway-a:/run/other"))),
            PathBuf::from("/run/midway-a/control.sock")
        );
        assert_eq!(
            default_control_socket(Some(OsStr::new(""))),
            PathBuf::from(DEFAULT_CONTROL_SOCKET)
        );
    }

    #[test]
    fn explicit_path_is_kept_and_marked() {
        let control = with("[control]\nsocket = \"/tmp/mw/control.sock\"\n")
            .unwrap()
            .unwrap();
        assert_eq!(control.socket, PathBuf::from("/tmp/mw/control.sock"));
        assert!(control.explicit);
        let default = with("").unwrap().unwrap();
        assert!(!default.explicit);
    }

    #[test]
    fn can_be_turned_off() {
        assert_eq!(with("[control]\nenabled = false\n").unwrap(), None);
        assert_eq!(with("[control]\nsocket = \"\"\n").unwrap(), None);
    }

    #[test]
    fn bad_paths_are_refused_with_the_key() {
        for bad in [
            "[control]\nsocket = \"control.sock\"\n".to_string(),
            format!("[control]\nsocket = \"/{}\"\n", "x".repeat(120)),
        ] {
            let err = with(&bad).unwrap_err().to_string();
            assert!(err.contains("control.socket"), "{bad}: {err}");
        }
        let err = with("[control]\nsocket = \"/tmp/x\"\nmode = 1\n").unwrap_err();
        assert!(err.to_string().contains("unknown field `mode`"), "{err}");
    }
}
