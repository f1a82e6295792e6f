//! What the monitors of this process's MongoDB clients last heard from each server, by
//! address (`host:port`).
//!
//! The driver's server-selection timeout carries the servers it could not use only as text:
//! its message is the topology's `Display`, a debug dump that ends each server with the
//! `Display` of its last error. Each monitor's failed heartbeat, though, carries that error
//! typed. Every client [`super::connect`] opens reports its heartbeats here, so that
//! [`super::describe`] can say, per server a selection names, why it could not be reached
//! (refused, timed out, authentication) from the error's kind rather than from its text.
//! A heartbeat that succeeds clears its server's entry; the table holds one entry per address
//! this process connects to, so it stays small.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use mongodb::error::{Error, ErrorKind};
use mongodb::event::sdam::SdamEvent;
use mongodb::event::EventHandler;

fn last_failures() -> &'static Mutex<BTreeMap<String, Error>> {
    static FAILURES: OnceLock<Mutex<BTreeMap<String, Error>>> = OnceLock::new();
    FAILURES.get_or_init(Mutex::default)
}

/// The handler a client's options get: it keeps each server's last failed heartbeat.
pub(super) fn handler() -> EventHandler<SdamEvent> {
    EventHandler::callback(|event| match event {
        // A monitor stopped because its client closed says nothing about the server.
        SdamEvent::ServerHeartbeatFailed(e)
            if !matches!(*e.failure.kind, ErrorKind::Internal { .. }) =>
        {
            record(e.server_address.to_string(), e.failure);
        }
        SdamEvent::ServerHeartbeatSucceeded(e) => {
            if let Ok(mut failures) = last_failures().lock() {
                failures.remove(&e.server_address.to_string());
            }
        }
        _ => {}
    })
}

fn record(address: String, failure: Error) {
    if let Ok(mut failures) = last_failures().lock() {
        failures.insert(address, failure);
    }
}

/// The last failure heard from each server that `message` (a server-selection error's)
/// names, by address. The message is read only to learn which servers it is about; why each
/// failed comes from the typed error kept for it.
pub(super) fn named_in(message: &str) -> Vec<(String, Error)> {
    let Ok(failures) = last_failures().lock() else {
        return Vec::new();
    };
    failures
        .iter()
        .filter(|(address, _)| mentions(message, address))
        .map(|(address, e)| (address.clone(), e.clone()))
        .collect()
}

/// Whether `text` names `address` as a whole (`127.0.0.1:1` is not in `127.0.0.1:10`).
fn mentions(text: &str, address: &str) -> bool {
    let part_of_name = |c: char| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_';
    text.match_indices(address).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + address.len()..].chars().next();
        !before.is_some_and(part_of_name) && !after.is_some_and(|c| c.is_ascii_digit())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_named_only_as_a_whole() {
        let text =
            "Servers: [ { Address: 127.0.0.1:10, Type: Unknown }, { Address: db-1:27017, } ]";
        assert!(mentions(text, "127.0.0.1:10"));
        assert!(!mentions(text, "127.0.0.1:1"));
        assert!(!mentions(text, "27.0.0.1:10"));
        assert!(mentions(text, "db-1:27017"));
        assert!(!mentions(text, "b-1:27017"));
    }
}
