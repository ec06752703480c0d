//! Expression attribute names: every attribute in an expression is written `#name` (so no
//! attribute ever meets one of DynamoDB's reserved words), and the map a request needs is read
//! from its expressions, so a request never names one it does not use (which DynamoDB refuses).

use std::collections::HashMap;

/// The `#name` → `name` map of every `#name` in `expressions`.
pub(crate) fn names(expressions: &[&str]) -> HashMap<String, String> {
    let mut map = HashMap::new();
    for expression in expressions {
        let mut rest = *expression;
        while let Some(at) = rest.find('#') {
            let tail = &rest[at + 1..];
            let len = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            let name = &tail[..len];
            map.insert(format!("#{name}"), name.to_owned());
            rest = &tail[len..];
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_once() {
        let map = names(&[
            "SET #st = :st, #rev = #rev + :one",
            "#st = :p AND #exp > :now",
        ]);
        let mut found: Vec<_> = map.into_iter().collect();
        found.sort();
        assert_eq!(
            found,
            [("#exp", "exp"), ("#rev", "rev"), ("#st", "st")]
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
        );
    }
}
