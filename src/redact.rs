//! Credentials never reach output or logs: every connection string shown to anyone passes
//! through [`redact_uri`] or is wrapped in [`Redacted`].

use std::fmt;

/// Replaces the password of every `scheme://user:password@host` in `text` with `***`, and the
/// value of `password=` query parameters too. Text without credentials comes back unchanged.
pub fn redact_uri(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find("://") {
        let (head, tail) = rest.split_at(pos + 3);
        out.push_str(head);
        // The authority ends at the first '/', '?', '#' or whitespace; credentials end at its
        // last '@' (a password may itself contain '@' when not percent-encoded).
        let end = tail
            .find(|c: char| c == '/' || c == '?' || c == '#' || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) => {
                let userinfo = &authority[..at];
                match userinfo.find(':') {
                    Some(colon) => {
                        out.push_str(&userinfo[..colon]);
                        out.push_str(":***");
                    }
                    None => out.push_str(userinfo),
                }
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    redact_password_params(&out)
}

/// Whether a connection string holds a password in plain text: a `user:password@` whose
/// password is not only `${...}` references (resolved by each process when it connects), or a
/// `password=` option.
pub fn has_inline_password(uri: &str) -> bool {
    let plain = |value: &str| {
        let mut rest = value;
        while let Some(at) = rest.find("${") {
            if !rest[..at].is_empty() {
                return true;
            }
            match rest[at..].find('}') {
                Some(end) => rest = &rest[at + end + 1..],
                None => return true,
            }
        }
        !rest.is_empty()
    };
    let Some(pos) = uri.find("://") else {
        return false;
    };
    let tail = &uri[pos + 3..];
    let end = tail.find(['/', '?', '#']).unwrap_or(tail.len());
    let authority = &tail[..end];
    if let Some(at) = authority.rfind('@') {
        if let Some((_, password)) = authority[..at].split_once(':') {
            if plain(password) {
                return true;
            }
        }
    }
    uri.split_once('?').is_some_and(|(_, query)| {
        query.split(['&', ';']).any(|pair| {
            pair.split_once('=')
                .is_some_and(|(k, v)| k.eq_ignore_ascii_case("password") && plain(v))
        })
    })
}

fn redact_password_params(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = find_password_param(rest) {
        let (head, tail) = rest.split_at(pos);
        out.push_str(head);
        let eq = tail.find('=').expect("matched a key ending in '='") + 1;
        out.push_str(&tail[..eq]);
        out.push_str("***");
        let end = tail[eq..]
            .find(|c: char| c == '&' || c == '#' || c.is_whitespace())
            .map(|e| eq + e)
            .unwrap_or(tail.len());
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

fn find_password_param(text: &str) -> Option<usize> {
    let lower = text.to_ascii_lowercase();
    ["?password=", "&password=", " password="]
        .iter()
        .filter_map(|key| lower.find(key).map(|p| p + 1))
        .min()
}

/// A connection string that prints redacted through `Display` and `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Redacted(String);

impl Redacted {
    pub fn new(uri: impl Into<String>) -> Self {
        Redacted(uri.into())
    }

    /// The real value, for handing to a driver. Never print it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_uri(&self.0))
    }
}

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Redacted({:?})", redact_uri(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_in_plain_text_is_told_from_a_reference() {
        for plain in [
            "mongodb://app:hunter2@h:27017/db",
            "mongodb://app:p@ss@h",
            "mongodb://app:x${PW}@h",
            "mongodb://app:${PW@h",
            "mongodb://h/?authMechanism=PLAIN&password=hunter2",
        ] {
            assert!(has_inline_password(plain), "{plain}");
        }
        for safe in [
            "mongodb://h:27017",
            "mongodb://app@h/?authSource=admin",
            "mongodb://app:${MONGO_PASSWORD}@h",
            "mongodb://app:${file:/run/secrets/pw}@h",
            "mongodb://${USER}:${PW}@h/?replicaSet=rs0",
            "${RESHARD_S1_URI}",
            "${file:/run/secrets/s1-uri}",
        ] {
            assert!(!has_inline_password(safe), "{safe}");
        }
    }

    #[test]
    fn passwords_are_replaced_and_everything_else_kept() {
        let cases = [
            (
                "postgres://alice:s3cret@db.example:5432/reshard",
                "postgres://alice:***@db.example:5432/reshard",
            ),
            (
                "mongodb://u:p@h1:27017,h2:27017/?replicaSet=rs0",
                "mongodb://u:***@h1:27017,h2:27017/?replicaSet=rs0",
            ),
            (
                "mongodb+srv://app:p@ss@cluster0.example/orders",
                "mongodb+srv://app:***@cluster0.example/orders",
            ),
            ("postgres://bob@localhost/x", "postgres://bob@localhost/x"),
            (
                "postgres://localhost/x?user=a&password=hunter2&sslmode=require",
                "postgres://localhost/x?user=a&password=***&sslmode=require",
            ),
            (
                "cannot reach mongodb://u:pw@h:1 and postgres://v:pw2@h:2/db",
                "cannot reach mongodb://u:***@h:1 and postgres://v:***@h:2/db",
            ),
            ("no uri here", "no uri here"),
        ];
        for (input, expected) in cases {
            assert_eq!(redact_uri(input), expected, "{input}");
        }
    }

    #[test]
    fn redacted_never_prints_the_secret() {
        let r = Redacted::new("mongodb://root:topsecret@h:27017");
        assert!(!format!("{r} {r:?}").contains("topsecret"));
        assert_eq!(r.expose(), "mongodb://root:topsecret@h:27017");
    }
}
