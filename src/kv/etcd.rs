//! [`EtcdKvBackend`]: the metadata store on an etcd cluster (being implemented).

/// gRPC status codes that may clear up on retry: DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, UNAVAILABLE.
const RETRYABLE_CODES: [i32; 3] = [4, 8, 14];

/// Whether an etcd client error may clear up on retry (the cluster was unreachable, overloaded or timed out).
pub(crate) fn is_retryable(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match e {
        E::GRpcStatus(status) => RETRYABLE_CODES.contains(&i32::from(status.code())),
        E::TransportError(_) | E::IoError(_) => true,
        _ => false,
    }
}
