//! How the side-effecting tools are presented: the capability in `get_info`, and each tool's
//! description, `_meta` and annotations in `list_tools` ([contract §5](idem_core::contract#mcp)).

use rmcp::handler::server::router::tool::ToolRouter;
use std::sync::Arc;

use idem_core::KeySource;
use rmcp::model::{JsonObject, ListToolsResult, MetaObject, ServerConfig, Tool, ToolAnnotations};
use serde_json::{Value, json};

use super::{IdempotentTools, ToolSettings};
use crate::key;

/// The tool `_meta` entry with the machine-readable contract (`processingWindowMs`,
/// `minClientDeadlineMs`, `keyRequired`): `"io.idem/idempotency"`.
pub const TOOL_META_KEY: &str = "io.idem/idempotency";
/// The capability advertised in `capabilities.experimental` (rmcp's `ToolsCapability` has no
/// slot for the draft's `tools.idempotency`): `"tools.idempotency"`.
pub const CAPABILITY: &str = "tools.idempotency";

impl IdempotentTools {
    /// Adds the `tools.idempotency` capability (in `capabilities.experimental`) to `info`, and
    /// MCP's tasks extension when the server serves tasks ([`IdempotentTools::tasks`]).
    pub fn advertise(&self, mut info: ServerConfig) -> ServerConfig {
        let mut names: Vec<&String> = self.tools.keys().collect();
        names.sort();
        let mut settings = JsonObject::new();
        settings.insert("keyField".into(), json!(key::PARAMS_FIELD));
        settings.insert("metaKey".into(), json!(key::META_KEY));
        settings.insert("tools".into(), json!(names));
        info.capabilities
            .experimental
            .get_or_insert_with(Default::default)
            .insert(CAPABILITY.to_owned(), settings);
        if self.tasks.is_some() {
            info.capabilities
                .extensions
                .get_or_insert_with(Default::default)
                .insert(
                    rmcp::model::TASKS_EXTENSION_ID.to_owned(),
                    JsonObject::new(),
                );
        }
        info
    }

    /// Describes the protection of each side-effecting tool in `tools`: its description gains the
    /// processing window, the minimum client retry deadline, its key source and window
    /// ([contract §5.1](idem_core::contract#keyless)), its `_meta` gains [`TOOL_META_KEY`], and
    /// its annotations are set honestly: `readOnlyHint: false`, `idempotentHint: true` only when
    /// every call that runs is protected by a key (any key source but
    /// [`KeySource::Unprotected`]), `destructiveHint` per `ToolSettings::destructive`. With
    /// [`KeySource::ModelArgument`], its input schema gains that argument, a required string.
    pub fn describe(&self, tools: Vec<Tool>) -> Vec<Tool> {
        tools.into_iter().map(|t| self.describe_tool(t)).collect()
    }

    fn describe_tool(&self, mut tool: Tool) -> Tool {
        let Some(settings) = self.tools.get(tool.name.as_ref()) else {
            return tool;
        };
        let contract = self.contract_of(settings);
        let window = contract.processing_window().as_millis() as u64;
        let deadline = contract.min_client_deadline().as_millis() as u64;
        let max_wait = settings.tool.max_wait().as_millis() as u64;
        let without = without_key(settings);
        let derived = matches!(
            settings.tool.key_source(),
            KeySource::Arguments(_) | KeySource::ModelArgument(_) | KeySource::Request
        );
        let waited = match derived && settings.tool.derived_key_wait() {
            true => format!(
                " A repeat without a key sent while the first call runs is waited for, up to \
                 {max_wait} ms, and gets its result."
            ),
            false => String::new(),
        };
        let note = format!(
            "Side-effecting. Send an idempotency key made from your durable workflow step \
             (params.idempotencyKey, or params._meta[\"{meta}\"]) and reuse it on every retry: \
             with a key the call runs once and a repeat returns the first result; {without}. \
             Processing window: {window} ms; minimum client retry deadline: {deadline} ms — an \
             attempt shorter than that is cut off while the tool is still working. A retry sent \
             while the first call runs may wait for its result: params._meta[\"{wait}\"] \
             (seconds), up to {max_wait} ms.{waited}",
            meta = key::META_KEY,
            wait = crate::wait::WAIT_META_KEY,
        );
        tool.description = Some(match tool.description.take() {
            Some(d) if !d.is_empty() => format!("{d}\n\n{note}").into(),
            _ => note.into(),
        });
        let mut annotations = tool.annotations.take().unwrap_or_default();
        annotations = with_hints(
            annotations,
            settings.tool.key_source().protects_every_call(),
            settings.destructive,
        );
        tool.annotations = Some(annotations);
        let meta = tool.meta.get_or_insert_with(MetaObject::default);
        meta.0.insert(
            TOOL_META_KEY.to_owned(),
            json!({
                "processingWindowMs": window,
                "minClientDeadlineMs": deadline,
                "keyRequired": settings.tool.key_source() == &KeySource::Refuse,
                "keySource": settings.tool.key_source().name(),
                "keyWindowMs": settings.tool.key_window().as_millis() as u64,
                "maxWaitMs": max_wait,
            }),
        );
        if let KeySource::ModelArgument(name) = settings.tool.key_source() {
            tool.input_schema = Arc::new(with_key_argument(&tool.input_schema, name));
        }
        tool
    }

    /// The `list_tools` answer of a server whose tools are `router`'s, each
    /// [described](Self::describe).
    pub fn list_routed<S: Send + Sync + 'static>(&self, router: &ToolRouter<S>) -> ListToolsResult {
        ListToolsResult::with_all_items(self.describe(router.list_all()))
    }
}

/// What the description says of a call without a key.
fn without_key(settings: &ToolSettings) -> String {
    let window = settings.tool.key_window().as_secs();
    let within = format!(
        "within {window} s the same call is the same operation and returns the first result, so \
         a deliberate repeat must differ"
    );
    match settings.tool.key_source() {
        KeySource::Arguments(pointers) if pointers.is_empty() => {
            format!("a call without a key is keyed by its arguments: {within} in its arguments")
        }
        KeySource::Arguments(pointers) => format!(
            "a call without a key is keyed by its arguments {}: {within} in one of them",
            pointers.join(", ")
        ),
        KeySource::ModelArgument(name) => format!(
            "a call without a key is keyed by the argument {name}: send the same {name} when you \
             retry the same action and a new one for a new action; {within} in {name}"
        ),
        KeySource::Request => format!(
            "a call without a key is keyed by its session and request id: only a resend of the \
             same request within {window} s returns the first result, a new call runs again"
        ),
        KeySource::Unprotected => {
            "a call without a key runs unprotected and a retry of it may repeat the effect".into()
        }
        _ => "a call without a key is refused".into(),
    }
}

/// `schema` with the required string argument `name` the model fills with its key.
fn with_key_argument(schema: &JsonObject, name: &str) -> JsonObject {
    let mut schema = schema.clone();
    schema.insert("type".into(), json!("object"));
    let properties = schema
        .entry("properties")
        .or_insert_with(|| Value::Object(JsonObject::new()));
    if let Some(properties) = properties.as_object_mut() {
        properties.insert(
            name.to_owned(),
            json!({"type": "string", "description": KeySource::MODEL_ARGUMENT_DESCRIPTION}),
        );
    }
    let required = schema.entry("required").or_insert_with(|| json!([]));
    if let Some(required) = required.as_array_mut()
        && !required.iter().any(|r| r == name)
    {
        required.push(json!(name));
    }
    schema
}

fn with_hints(
    mut annotations: ToolAnnotations,
    idempotent: bool,
    destructive: Option<bool>,
) -> ToolAnnotations {
    annotations.read_only_hint = Some(false);
    annotations.idempotent_hint = Some(idempotent);
    if destructive.is_some() {
        annotations.destructive_hint = destructive;
    }
    annotations
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_are_honest() {
        let a = with_hints(ToolAnnotations::default(), true, Some(false));
        assert_eq!(
            (a.read_only_hint, a.idempotent_hint, a.destructive_hint),
            (Some(false), Some(true), Some(false))
        );
        let a = with_hints(ToolAnnotations::default(), false, None);
        assert_eq!((a.idempotent_hint, a.destructive_hint), (Some(false), None));
    }

    #[test]
    fn the_model_argument_is_a_required_string() {
        let schema = json!({"type": "object", "properties": {"title": {"type": "string"}},
            "required": ["title"]});
        let with = with_key_argument(schema.as_object().unwrap(), "idempotency_key");
        assert_eq!(with["required"], json!(["title", "idempotency_key"]));
        assert_eq!(with["properties"]["idempotency_key"]["type"], "string");
        assert_eq!(
            with["properties"]["idempotency_key"]["description"],
            KeySource::MODEL_ARGUMENT_DESCRIPTION
        );
        assert_eq!(with["properties"]["title"], json!({"type": "string"}));
        let bare = with_key_argument(&JsonObject::new(), "k");
        assert_eq!(bare["required"], json!(["k"]));
    }
}
