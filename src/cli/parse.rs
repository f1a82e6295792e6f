//! The value parsers of the command line's arguments: each tells what it refused and what is
//! allowed.

use std::time::Duration;

use super::Until;
use crate::phase::Phase;

pub(super) fn parse_refresh_interval(s: &str) -> Result<Duration, String> {
    let d = crate::duration::parse(s)?;
    if d < Duration::from_secs(1) || d > Duration::from_secs(3600) {
        return Err(format!("{s:?} is outside the allowed range: from 1s to 1h"));
    }
    Ok(d)
}

/// The parsed `--on` of `hook add`.
#[derive(Clone, Debug, PartialEq)]
pub struct HookOnList(pub Vec<crate::hooks::HookOn>);

pub(super) fn parse_hook_on(s: &str) -> Result<HookOnList, String> {
    crate::hooks::HookOn::parse_list(s).map(HookOnList)
}

pub(super) fn parse_latency_budget(s: &str) -> Result<crate::settings::LatencyBudget, String> {
    crate::settings::LatencyBudget::parse(s)
}

pub(super) fn parse_hook_name(s: &str) -> Result<String, String> {
    crate::hooks::check_name(s).map(|()| s.to_owned())
}

pub(super) fn parse_command(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("the command is empty".into());
    }
    Ok(s.to_owned())
}

/// A hook's timeout: 100 ms to 1 h (a hook holds its delivery while it runs), in whole
/// milliseconds (as it is stored).
pub(super) fn parse_hook_timeout(s: &str) -> Result<Duration, String> {
    let d = crate::duration::parse(s)?;
    if d < Duration::from_millis(100) || d > Duration::from_secs(3600) {
        return Err(format!(
            "{s:?} is outside the allowed range: from 100ms to 1h"
        ));
    }
    crate::duration::whole(d, crate::duration::Unit::Milliseconds)
        .map_err(|why| format!("{s}: {why}"))?;
    Ok(d)
}

pub(super) fn parse_phase(s: &str) -> Result<Phase, String> {
    s.parse::<Phase>().map_err(|e| e.to_string())
}

/// A duration flag: humantime (`500ms`, `30s`, `5m`); a bare number is refused.
pub(super) fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::duration::parse(s)
}

/// A duration flag whose value is stored in a coarser unit than humantime's (a setting kept
/// in whole seconds or milliseconds): kept as written too, so that a value the unit cannot
/// hold is refused naming what was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrittenDuration {
    pub written: String,
    pub value: Duration,
}

impl WrittenDuration {
    /// The value as a whole, non-zero number of `unit`, or the refusal naming `flag`.
    pub fn whole(&self, flag: &str, unit: crate::duration::Unit) -> Result<u64, String> {
        crate::duration::whole(self.value, unit)
            .map_err(|why| format!("{flag} {}: {why}", self.written.trim()))
    }
}

pub(super) fn parse_written_duration(s: &str) -> Result<WrittenDuration, String> {
    Ok(WrittenDuration {
        written: s.to_owned(),
        value: crate::duration::parse(s)?,
    })
}

/// An address to listen on (`--metrics-addr`, `front --listen`): `HOST:PORT` (a host name is
/// resolved, its first IPv4 address taken) or `:PORT`, every interface (as Prometheus's own
/// `--web.listen-address=:9090`: an exporter is there to be scraped from elsewhere; write
/// `localhost:PORT` to keep it local).
pub(super) fn parse_listen_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::{SocketAddr, ToSocketAddrs};
    let text = s.trim();
    if let Some(port) = text.strip_prefix(':') {
        let port: u16 = port
            .parse()
            .map_err(|_| format!("{text:?}: the port must be a number from 0 to 65535"))?;
        return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!(
            "{text:?}: write HOST:PORT (localhost:9000, 10.0.0.5:9000) or :PORT"
        ));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!(
            "{text:?}: write HOST:PORT (localhost:9000, 10.0.0.5:9000) or :PORT, the port a \
             number from 0 to 65535"
        ));
    }
    let found: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|e| format!("{text:?}: cannot resolve {host:?}: {e}"))?
        .collect();
    // An IPv4 address first: `localhost` often resolves to `::1` before `127.0.0.1`, and a
    // scraper told `localhost:PORT` may try either.
    found
        .iter()
        .find(|a| a.is_ipv4())
        .or(found.first())
        .copied()
        .ok_or_else(|| format!("{text:?}: {host:?} resolves to no address"))
}

/// A lease's length: 2 s to 1 h.
pub(super) fn parse_lease_ttl(s: &str) -> Result<Duration, String> {
    let d = crate::duration::parse(s)?;
    if d < Duration::from_secs(2) {
        return Err(format!(
            "{s:?} is too short: a lease is at least 2s. A holder renews its lease every third \
             of it and stops writing a fifth of it before its end, so a shorter lease leaves a \
             command less than a second and its renewals a few hundred milliseconds, less than \
             a loaded state store or shard takes to answer (the allowed range is 2s to 1h)"
        ));
    }
    if d > Duration::from_secs(3600) {
        return Err(format!("{s:?} is outside the allowed range: from 2s to 1h"));
    }
    Ok(d)
}

pub(super) fn parse_until(s: &str) -> Result<Until, String> {
    Until::parse(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_shorter_than_two_seconds_is_refused_with_the_reason() {
        let e = parse_lease_ttl("1500ms").unwrap_err();
        assert!(e.contains("too short") && e.contains("renews"), "{e}");
        assert_eq!(parse_lease_ttl("2s").unwrap(), Duration::from_secs(2));
        assert!(parse_lease_ttl("2h").unwrap_err().contains("2s to 1h"));
    }

    #[test]
    fn a_listen_address_may_name_a_host_or_only_a_port() {
        assert_eq!(
            parse_listen_addr("127.0.0.1:9000").unwrap(),
            "127.0.0.1:9000".parse().unwrap()
        );
        assert_eq!(
            parse_listen_addr(":9000").unwrap(),
            "0.0.0.0:9000".parse().unwrap()
        );
        assert_eq!(parse_listen_addr("[::1]:9000").unwrap().port(), 9000);
        let local = parse_listen_addr("localhost:9000").unwrap();
        assert!(local.ip().is_loopback() && local.port() == 9000, "{local}");
        for bad in ["localhost", ":nine", "localhost:99999", ":"] {
            assert!(parse_listen_addr(bad).is_err(), "{bad}");
        }
    }
}
