//! Who acts, for the event log, leases and router registrations: this machine's name and the
//! operator's.

/// This machine's name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// `user@host`: the user from the environment (`USER`, `USERNAME`, `LOGNAME`), else the
/// operating system's name for this process's user (`/etc/passwd`), else `uid<N>`.
pub fn default_actor() -> String {
    let user = ["USER", "USERNAME", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
        .or_else(os_user)
        .unwrap_or_else(|| "unknown".to_owned());
    format!("{user}@{}", hostname())
}

/// The name of this process's real user, from `/proc/self/status` and `/etc/passwd`.
fn os_user() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .to_owned();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let name = passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        (fields.nth(1)? == uid).then(|| name.to_owned())
    });
    Some(name.unwrap_or(format!("uid{uid}")))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_os_user_is_named() {
        let user = super::os_user().expect("a user on Linux");
        assert!(!user.is_empty() && !user.contains(':'), "{user}");
    }
}
