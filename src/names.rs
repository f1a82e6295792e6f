//! MongoDB's naming rules, checked where a name enters reshard (`shard add`, version specs,
//! playbooks), so that a name MongoDB would refuse is caught at the door and not in the middle
//! of a migration. Each problem names the rule it breaks.
//!
//! The rules (MongoDB manual, "Naming Restrictions"):
//! - database names: not empty, under 64 bytes, none of `/ \ . " $`, a space or NUL (the
//!   Unix set; Windows adds `* < > : | ?`, which we refuse too, since a shard may run there);
//! - collection names: not empty, no `$`, no NUL, not starting with `system.` (reserved), and
//!   the namespace `<database>.<collection>` at most 255 bytes.

/// The largest database name, in bytes (MongoDB: "must be less than 64 bytes").
pub const MAX_DATABASE_BYTES: usize = 63;
/// The largest namespace `<database>.<collection>`, in bytes (MongoDB 4.4+).
pub const MAX_NAMESPACE_BYTES: usize = 255;

const DATABASE_FORBIDDEN: &[char] = &[
    '/', '\\', '.', ' ', '"', '$', '\0', '*', '<', '>', ':', '|', '?',
];

fn shown(c: char) -> String {
    match c {
        '\0' => "NUL".to_owned(),
        ' ' => "a space".to_owned(),
        c => format!("{c:?}"),
    }
}

/// Checks a database name; the message names the rule.
pub fn database(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a MongoDB database name must not be empty".to_owned());
    }
    if let Some(c) = name.chars().find(|c| DATABASE_FORBIDDEN.contains(c)) {
        return Err(format!(
            "database name {name:?} contains {}: MongoDB database names may not contain \
             / \\ . \" $ * < > : | ? a space or NUL",
            shown(c)
        ));
    }
    if name.len() > MAX_DATABASE_BYTES {
        return Err(format!(
            "database name {name:?} is {} bytes: MongoDB database names must be under 64 bytes",
            name.len()
        ));
    }
    Ok(())
}

/// Checks a collection name, and with `database` the length of the namespace they make.
pub fn collection(name: &str, database: Option<&str>) -> Result<(), String> {
    if name.is_empty() {
        return Err("a MongoDB collection name must not be empty".to_owned());
    }
    if name.contains('$') {
        return Err(format!(
            "collection name {name:?} contains '$': MongoDB collection names may not contain '$'"
        ));
    }
    if name.contains('\0') {
        return Err(format!(
            "collection name {name:?} contains NUL: MongoDB collection names may not contain \
             the null character"
        ));
    }
    if name.starts_with("system.") {
        return Err(format!(
            "collection name {name:?} starts with \"system.\", which MongoDB reserves for its \
             own collections"
        ));
    }
    if let Some(db) = database {
        let bytes = db.len() + 1 + name.len();
        if bytes > MAX_NAMESPACE_BYTES {
            return Err(format!(
                "namespace \"{db}.{name}\" is {bytes} bytes: MongoDB namespaces \
                 (<database>.<collection>) may be at most {MAX_NAMESPACE_BYTES} bytes"
            ));
        }
    } else if name.len() + 2 > MAX_NAMESPACE_BYTES {
        return Err(format!(
            "collection name {name:?} is {} bytes: with the database name and the dot it \
             must fit MongoDB's {MAX_NAMESPACE_BYTES}-byte namespace limit",
            name.len()
        ));
    }
    Ok(())
}

/// Problems of a connection string that the driver lets through: an option given with an
/// empty value (`replicaSet=`), which means nothing and hides a typo or a missing variable.
pub fn uri_options(uri: &str) -> Result<(), String> {
    let Some((_, query)) = uri.split_once('?') else {
        return Ok(());
    };
    for pair in query.split(['&', ';']).filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some((key, "")) => {
                return Err(format!(
                    "the URI option {key} has an empty value; give it a value or leave it out"
                ))
            }
            None => {
                return Err(format!(
                    "the URI option {pair:?} has no value (expected {pair}=VALUE)"
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_names_follow_mongodbs_rules() {
        assert!(database("shop").is_ok());
        assert!(database("shop_2-eu").is_ok());
        assert!(database(&"d".repeat(63)).is_ok());
        for (bad, rule) in [
            ("", "must not be empty"),
            ("bad.db", "contains '.'"),
            ("a/b", "contains '/'"),
            ("a\\b", "contains '\\\\'"),
            ("a b", "contains a space"),
            ("a\"b", "contains '\"'"),
            ("a$b", "contains '$'"),
            ("a\0b", "contains NUL"),
            ("a:b", "contains ':'"),
        ] {
            let e = database(bad).unwrap_err();
            assert!(e.contains(rule), "{bad:?}: {e}");
        }
        let e = database(&"d".repeat(64)).unwrap_err();
        assert!(e.contains("64 bytes") && e.contains("under 64"), "{e}");
        // Bytes, not characters.
        assert!(database(&"é".repeat(32)).is_err());
    }

    #[test]
    fn collection_names_follow_mongodbs_rules() {
        assert!(collection("orders_v2", None).is_ok());
        assert!(collection("orders.archive", Some("shop")).is_ok());
        assert!(collection("systems", None).is_ok());
        for (bad, rule) in [
            ("", "must not be empty"),
            ("bad$name", "'$'"),
            ("a\0b", "null character"),
            ("system.users", "reserves"),
        ] {
            let e = collection(bad, None).unwrap_err();
            assert!(e.contains(rule), "{bad:?}: {e}");
        }
        let long = "c".repeat(250);
        assert!(collection(&long, Some("shop")).is_ok());
        let e = collection(&long, Some("shop12")).unwrap_err();
        assert!(e.contains("257 bytes") && e.contains("255"), "{e}");
        assert!(collection(&"c".repeat(254), None).is_err());
    }

    #[test]
    fn empty_uri_options_are_refused() {
        assert!(uri_options("mongodb://h:27017/?replicaSet=rs0&w=majority").is_ok());
        assert!(uri_options("mongodb://h:27017").is_ok());
        let e = uri_options("mongodb://h/?replicaSet=").unwrap_err();
        assert!(e.contains("replicaSet") && e.contains("empty"), "{e}");
        assert!(uri_options("mongodb://h/?w=1&tls")
            .unwrap_err()
            .contains("tls"));
    }
}
