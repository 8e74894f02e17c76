//! Asks a port which services its gRPC reflection lists, in both protocol versions — so that a
//! test can check that a port advertises exactly what it serves, to old and new tools alike.
//!
//! Deliberately left out: reading descriptors; only the service list is asked for.

use tonic::transport::Endpoint;
use tonic_reflection::pb::{v1, v1alpha};

/// The services a port lists over reflection `v1` and `v1alpha`, each sorted.
pub async fn listed_services(addr: &str) -> Result<(Vec<String>, Vec<String>), String> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    let v1_req = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut c1 = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let mut stream = c1
        .server_reflection_info(tokio_stream::once(v1_req))
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    let r1 = stream
        .message()
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no v1 reply")?;
    let mut names1: Vec<String> = match r1.message_response {
        Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(l)) => {
            l.service.into_iter().map(|s| s.name).collect()
        }
        other => return Err(format!("v1: unexpected reply {other:?}")),
    };
    let va_req = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1alpha::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut ca = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let mut stream = ca
        .server_reflection_info(tokio_stream::once(va_req))
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    let ra = stream
        .message()
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no v1alpha reply")?;
    let mut names_a: Vec<String> = match ra.message_response {
        Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(l)) => {
            l.service.into_iter().map(|s| s.name).collect()
        }
        other => return Err(format!("v1alpha: unexpected reply {other:?}")),
    };
    names1.sort();
    names_a.sort();
    Ok((names1, names_a))
}
