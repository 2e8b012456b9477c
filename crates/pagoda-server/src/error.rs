//! Errors: the crate's one error enum ([`ServerError`], for start-up and
//! serving failures), the HTTP error every route returns ([`ApiError`], in
//! OpenAI's `{"error": {"message", "type", "param", "code"}}` shape), and the
//! JSON body extractor ([`JsonBody`]) whose rejections are OpenAI-shaped too
//! (and which enforces the body read deadline: 408).
//!
//! Invariant: nothing a client sends can make a handler panic; every refusal
//! is an [`ApiError`] with a 4xx status and a message naming the cause, and
//! only engine failures become 5xx.

use crate::conn::BodyDeadline;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use pagoda_engine::EngineError;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// What can stop the server itself.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("server failed: {0}")]
    Io(#[from] std::io::Error),
}

/// An error response: status plus OpenAI's error object.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, ...
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (503 when overloaded).
    pub retry_after: Option<u32>,
}

#[derive(Serialize)]
struct ErrorEnvelope<'a> {
    error: ErrorObject<'a>,
}

#[derive(Serialize)]
struct ErrorObject<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    /// A 400 `invalid_request_error`.
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// A 400 naming the offending parameter.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.to_string()),
            ..ApiError::invalid(message)
        }
    }

    pub fn unauthorized() -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            kind: "authentication_error",
            code: Some("invalid_api_key"),
            ..ApiError::invalid("missing or invalid API key (send 'Authorization: Bearer KEY')")
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "internal_server_error",
            ..ApiError::invalid(message)
        }
    }

    /// Names the request parameter at fault (OpenAI's `param`), on any
    /// error: `ApiError::invalid(..).with_param("n")`.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The JSON body (also sent as an SSE event when a stream fails).
    pub fn body_json(&self) -> String {
        let envelope = ErrorEnvelope {
            error: ErrorObject {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        };
        serde_json::to_string(&envelope).unwrap_or_else(|_| {
            r#"{"error":{"message":"error","type":"internal_server_error","param":null,"code":null}}"#
                .to_string()
        })
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::InvalidRequest(m) => ApiError::invalid(m),
            EngineError::Overloaded { .. } => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                kind: "server_overloaded",
                code: Some("server_overloaded"),
                retry_after: Some(1),
                ..ApiError::invalid(format!("the server is overloaded ({e}); retry later"))
            },
            EngineError::Shutdown => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                kind: "service_unavailable",
                ..ApiError::invalid(e.to_string())
            },
            other => ApiError::internal(other.to_string()),
        }
    }
}

impl From<pagoda_model::ModelError> for ApiError {
    fn from(e: pagoda_model::ModelError) -> Self {
        ApiError::invalid(e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            self.body_json(),
        )
            .into_response();
        if self.status == StatusCode::REQUEST_TIMEOUT {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// A JSON request body. Unlike axum's `Json`, it does not insist on a
/// `Content-Type` header (curl's `-d` sends a form type), and every rejection
/// is an [`ApiError`]: 413 for a body over the limit, 400 for malformed JSON
/// or a field of the wrong type (naming the field).
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let deadline = req.extensions().get::<BodyDeadline>().copied();
        let read = Bytes::from_request(req, state);
        let read = match deadline {
            Some(BodyDeadline(at)) => tokio::time::timeout_at(at, read)
                .await
                .map_err(|_| body_timeout())?,
            None => read.await,
        };
        let bytes = read.map_err(|r| {
            let status = r.status();
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError {
                    status,
                    ..ApiError::invalid("request body too large")
                }
            } else {
                ApiError::invalid(format!("cannot read the request body: {}", r.body_text()))
            }
        })?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// 408 for a body that did not arrive in time; the connection closes (the
/// rest of the body would be read as the next request).
fn body_timeout() -> ApiError {
    ApiError {
        status: StatusCode::REQUEST_TIMEOUT,
        code: Some("request_timeout"),
        ..ApiError::invalid("the request body did not arrive within the body read timeout")
    }
}

/// Parses `bytes` as a `T`, naming the field at fault.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut *de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::invalid(format!("malformed JSON body: {inner}"))
        } else {
            data_error(path, inner)
        }
    })?;
    // Only whitespace may follow the value (`{...} xyz` is not JSON).
    de.end().map_err(|e| {
        ApiError::invalid(format!(
            "malformed JSON body: {e} (only whitespace may follow the JSON value)"
        ))
    })?;
    Ok(value)
}

/// Reads a `T` out of an already parsed body, naming the field at fault.
/// (Request types read their shared sampling fields this way rather than
/// through `#[serde(flatten)]`, which would lose the field's name.)
pub fn from_value<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        data_error(path, e.into_inner())
    })
}

fn data_error(path: String, inner: serde_json::Error) -> ApiError {
    if path == "." || path.is_empty() {
        ApiError::invalid(format!("invalid request body: {inner}"))
    } else {
        ApiError::invalid_param(&path, format!("invalid value for '{path}': {inner}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    struct Req {
        #[allow(dead_code)]
        temperature: Option<f32>,
    }

    #[test]
    fn wrong_type_names_the_field_and_syntax_errors_say_malformed() {
        let e = parse_json::<Req>(br#"{"temperature": "hot"}"#).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = parse_json::<Req>(br#"{"temperature": "#).unwrap_err();
        assert!(e.message.contains("malformed JSON"), "{}", e.message);
        assert!(parse_json::<Req>(br#"{"temperature": 1, "unknown": [1]}"#).is_ok());
    }

    #[test]
    fn trailing_data_after_the_body_is_malformed_but_whitespace_is_fine() {
        for body in [
            &br#"{"temperature": 1} xyz"#[..],
            br#"{"temperature": 1}{}"#,
        ] {
            let e = parse_json::<Req>(body).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert!(e.message.contains("trailing characters"), "{}", e.message);
        }
        assert!(parse_json::<Req>(b"{\"temperature\": 1} \r\n\t ").is_ok());
    }

    #[test]
    fn error_body_has_openai_shape() {
        let v: serde_json::Value =
            serde_json::from_str(&ApiError::invalid_param("top_p", "bad").body_json()).unwrap();
        assert_eq!(v["error"]["message"], "bad");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "top_p");
        assert!(v["error"]["code"].is_null());
    }
}
