//! [`RsKafkaTopicAdmin`]: the [`TopicAdmin`](super::admin::TopicAdmin) over rskafka 0.6.

use rskafka::client::error::{Error as RsKafkaError, ProtocolError, RequestError};

/// Whether an rskafka error may go away on its own: a broker unreachable or restarting, a timeout, the controller
/// moving. A bad name, replication factor or request does not.
pub fn is_retryable_rskafka_error(e: &RsKafkaError) -> bool {
    match e {
        RsKafkaError::Connection(_) | RsKafkaError::Timeout => true,
        RsKafkaError::Request(r) => matches!(r, RequestError::IO(_) | RequestError::Poisoned(_)),
        // rskafka retries only retryable errors; running out of its deadline leaves them retryable.
        RsKafkaError::RetryFailed(_) => true,
        RsKafkaError::ServerError { protocol_error, .. } => matches!(
            protocol_error,
            ProtocolError::NotController
                | ProtocolError::RequestTimedOut
                | ProtocolError::LeaderNotAvailable
                | ProtocolError::NotLeaderOrFollower
                | ProtocolError::BrokerNotAvailable
                | ProtocolError::NetworkException
                | ProtocolError::StaleControllerEpoch
                | ProtocolError::ThrottlingQuotaExceeded
        ),
        _ => false,
    }
}
