//! The errors of the commands that drive the engine, each with its exit code.

#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// Nothing was started and nothing changed (exit 2).
    #[error("{0}")]
    Refused(String),
    /// Something failed after the deploy began (exit 1); the message says what state is left.
    #[error("{0}")]
    Failed(String),
}

impl DeployError {
    pub fn exit_code(&self) -> u8 {
        match self {
            DeployError::Refused(_) => 2,
            DeployError::Failed(_) => 1,
        }
    }
}

pub fn refused(message: impl Into<String>) -> DeployError {
    DeployError::Refused(message.into())
}
