//! Running one statement with its values, in the way the store's connection allows: a prepared
//! statement that sqlx keeps per connection (direct connections), or, behind a transaction
//! pooler, one simple-protocol query with the values written in as typed literals, so that no
//! prepared statement, named or unnamed, exists outside the round trip that uses it
//! ([contract §7](idem_core::contract#traps)).
//!
//! Why not sqlx's unnamed statements (`persistent(false)`): sqlx parses and binds them in two
//! round trips, each ending with `Sync`, and a transaction pooler may hand the second to another
//! server connection, where the unnamed statement is missing or is another one.

use std::borrow::Cow;

use sqlx::postgres::{PgArguments, PgQueryResult, PgRow};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Postgres, SqlSafeStr, SqlStr};

/// A value written into SQL text: its type's name and its text (`None`: `NULL`).
pub(crate) trait Literal {
    /// The type the literal is cast to, as sqlx would have bound it.
    const TYPE: &'static str;
    /// The type of an array of such values (a batch binds one array per column).
    const ARRAY: &'static str;
    /// The value's text form, as PostgreSQL reads it for [`Self::TYPE`].
    fn text(&self) -> Option<Cow<'_, str>>;
}

impl Literal for &str {
    const TYPE: &'static str = "text";
    const ARRAY: &'static str = "text[]";
    fn text(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(self))
    }
}

impl Literal for String {
    const TYPE: &'static str = "text";
    const ARRAY: &'static str = "text[]";
    fn text(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(self))
    }
}

impl Literal for i64 {
    const TYPE: &'static str = "int8";
    const ARRAY: &'static str = "int8[]";
    fn text(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Owned(self.to_string()))
    }
}

impl Literal for i32 {
    const TYPE: &'static str = "int4";
    const ARRAY: &'static str = "int4[]";
    fn text(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Owned(self.to_string()))
    }
}

impl<T: Literal> Literal for Option<T> {
    const TYPE: &'static str = T::TYPE;
    const ARRAY: &'static str = T::ARRAY;
    fn text(&self) -> Option<Cow<'_, str>> {
        self.as_ref().and_then(Literal::text)
    }
}

/// A one-dimensional array, in PostgreSQL's array text form: `{"a","b",NULL}`, each element
/// quoted with `"` and `\` escaped inside the quotes.
impl<T: Literal> Literal for Vec<T> {
    const TYPE: &'static str = T::ARRAY;
    // Arrays of arrays are never bound.
    const ARRAY: &'static str = T::ARRAY;
    fn text(&self) -> Option<Cow<'_, str>> {
        let mut out = String::from("{");
        for (i, element) in self.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            match element.text() {
                None => out.push_str("NULL"),
                Some(text) => {
                    out.push('"');
                    for c in text.chars() {
                        if matches!(c, '"' | '\\') {
                            out.push('\\');
                        }
                        out.push(c);
                    }
                    out.push('"');
                }
            }
        }
        out.push('}');
        Some(Cow::Owned(out))
    }
}

/// `value` as an escape-string literal cast to its type (`E'…'::int8`, `NULL::text`): the same
/// value and type a bind parameter would have had, whatever `standard_conforming_strings` is.
fn write_literal<T: Literal>(value: &T, out: &mut String) -> Result<(), sqlx::Error> {
    match value.text() {
        None => out.push_str("NULL"),
        Some(text) => {
            // A NUL would end the query text early; PostgreSQL's text cannot hold one anyway.
            if text.contains('\0') {
                return Err(sqlx::Error::Encode(
                    "a value holds a NUL character, which PostgreSQL's text cannot store".into(),
                ));
            }
            out.push_str("E'");
            for c in text.chars() {
                match c {
                    '\'' => out.push_str("''"),
                    '\\' => out.push_str("\\\\"),
                    c => out.push(c),
                }
            }
            out.push('\'');
        }
    }
    out.push_str("::");
    out.push_str(T::TYPE);
    Ok(())
}

/// `sql` with each `$n` outside a quoted string or identifier replaced by `values[n - 1]`.
fn render(sql: &str, values: &[String]) -> Result<String, sqlx::Error> {
    let mut out = String::with_capacity(sql.len() + values.iter().map(String::len).sum::<usize>());
    let mut chars = sql.char_indices().peekable();
    let mut quote = None;
    while let Some((i, c)) = chars.next() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '$') if chars.peek().is_some_and(|(_, d)| d.is_ascii_digit()) => {
                let start = i + 1;
                let mut end = start;
                while let Some((j, d)) = chars.peek().copied().filter(|(_, d)| d.is_ascii_digit()) {
                    end = j + d.len_utf8();
                    chars.next();
                }
                let n: usize = sql[start..end].parse().unwrap_or(0);
                let value = n
                    .checked_sub(1)
                    .and_then(|k| values.get(k))
                    .ok_or_else(|| {
                        sqlx::Error::Protocol(format!(
                            "statement names ${n} but has {} values",
                            values.len()
                        ))
                    })?;
                out.push_str(value);
                continue;
            }
            _ => {}
        }
        out.push(c);
    }
    Ok(out)
}

/// One statement and its values, run prepared or inline (see the module docs).
pub(crate) enum Statement<'q> {
    /// sqlx's prepared statement, cached on the connection.
    Prepared(Query<'q, Postgres, PgArguments>),
    /// The SQL and its values as literals, for one simple-protocol query.
    Inline {
        /// The statement with `$n` placeholders.
        sql: SqlStr,
        /// Each value, rendered; the first error met (a NUL in a value).
        values: Result<Vec<String>, sqlx::Error>,
    },
}

impl<'q> Statement<'q> {
    /// `sql`, prepared unless `inline`.
    pub(crate) fn new(sql: SqlStr, inline: bool) -> Self {
        if inline {
            Self::Inline {
                sql,
                values: Ok(Vec::new()),
            }
        } else {
            Self::Prepared(sqlx::query(sql))
        }
    }

    /// Binds the next `$n`.
    pub(crate) fn bind<T>(self, value: T) -> Self
    where
        T: Literal + sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres> + Send + 'q,
    {
        match self {
            Self::Prepared(q) => Self::Prepared(q.bind(value)),
            Self::Inline { sql, values } => {
                let values = values.and_then(|mut values| {
                    let mut text = String::new();
                    write_literal(&value, &mut text)?;
                    values.push(text);
                    Ok(values)
                });
                Self::Inline { sql, values }
            }
        }
    }

    fn inline(
        sql: &SqlStr,
        values: Result<Vec<String>, sqlx::Error>,
    ) -> Result<SqlStr, sqlx::Error> {
        let text = render(sql.as_str(), &values?)?;
        // The SQL was trusted before; the values are literals escaped above.
        Ok(AssertSqlSafe(text).into_sql_str())
    }

    /// Runs it; the rows affected.
    pub(crate) async fn execute<'e, 'c: 'e, E>(
        self,
        executor: E,
    ) -> Result<PgQueryResult, sqlx::Error>
    where
        'q: 'e,
        E: sqlx::Executor<'c, Database = Postgres>,
    {
        match self {
            Self::Prepared(q) => q.execute(executor).await,
            Self::Inline { sql, values } => {
                sqlx::raw_sql(Self::inline(&sql, values)?)
                    .execute(executor)
                    .await
            }
        }
    }

    /// Runs it; its row, if any.
    pub(crate) async fn fetch_optional<'e, 'c: 'e, E>(
        self,
        executor: E,
    ) -> Result<Option<PgRow>, sqlx::Error>
    where
        'q: 'e,
        E: sqlx::Executor<'c, Database = Postgres>,
    {
        match self {
            Self::Prepared(q) => q.fetch_optional(executor).await,
            Self::Inline { sql, values } => {
                sqlx::raw_sql(Self::inline(&sql, values)?)
                    .fetch_optional(executor)
                    .await
            }
        }
    }

    /// Runs it; its one row.
    pub(crate) async fn fetch_one<'e, 'c: 'e, E>(self, executor: E) -> Result<PgRow, sqlx::Error>
    where
        'q: 'e,
        E: sqlx::Executor<'c, Database = Postgres>,
    {
        match self {
            Self::Prepared(q) => q.fetch_one(executor).await,
            Self::Inline { sql, values } => {
                sqlx::raw_sql(Self::inline(&sql, values)?)
                    .fetch_one(executor)
                    .await
            }
        }
    }

    /// Runs it; every row.
    pub(crate) async fn fetch_all<'e, 'c: 'e, E>(
        self,
        executor: E,
    ) -> Result<Vec<PgRow>, sqlx::Error>
    where
        'q: 'e,
        E: sqlx::Executor<'c, Database = Postgres>,
    {
        match self {
            Self::Prepared(q) => q.fetch_all(executor).await,
            Self::Inline { sql, values } => {
                sqlx::raw_sql(Self::inline(&sql, values)?)
                    .fetch_all(executor)
                    .await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit<T: Literal>(v: T) -> String {
        let mut s = String::new();
        write_literal(&v, &mut s).unwrap();
        s
    }

    #[test]
    fn literals_are_typed_and_escaped() {
        assert_eq!(lit("it's"), "E'it''s'::text");
        assert_eq!(lit(r"a\'b"), r"E'a\\''b'::text");
        assert_eq!(lit(-5i64), "E'-5'::int8");
        assert_eq!(lit(Some(201i32)), "E'201'::int4");
        assert_eq!(lit(None::<String>), "NULL::text");
        assert_eq!(lit("é 🎫"), "E'é 🎫'::text");
        assert!(write_literal(&"a\0b", &mut String::new()).is_err());
    }

    #[test]
    fn arrays_are_typed_and_escaped_twice() {
        assert_eq!(lit(Vec::<i64>::new()), "E'{}'::int8[]");
        assert_eq!(lit(vec![1i64, -2]), r#"E'{"1","-2"}'::int8[]"#);
        assert_eq!(lit(vec![Some(201i32), None]), r#"E'{"201",NULL}'::int4[]"#);
        // `"` and `\` are escaped for the array, then `'` and `\` for the string.
        assert_eq!(
            lit(vec![
                "it's".to_owned(),
                r#"a"b\c"#.to_owned(),
                "NULL".to_owned()
            ]),
            r#"E'{"it''s","a\\"b\\\\c","NULL"}'::text[]"#
        );
    }

    #[test]
    fn placeholders_outside_quotes_are_replaced() {
        let values = ["A".to_owned(), "B".to_owned(), "K".to_owned()];
        let mut many: Vec<String> = (1..=11).map(|i| format!("v{i}")).collect();
        assert_eq!(
            render("SELECT $1, '$2', \"$3\", $3", &values).unwrap(),
            "SELECT A, '$2', \"$3\", K"
        );
        assert_eq!(
            render("x = $11 AND y = $1", &many).unwrap(),
            "x = v11 AND y = v1"
        );
        many.truncate(2);
        assert!(render("x = $3", &many).is_err());
        assert!(render("x = $0", &many).is_err());
        assert_eq!(render("a || 'it''s $1'", &many).unwrap(), "a || 'it''s $1'");
    }
}
