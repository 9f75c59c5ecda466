//! An error and its causes on one line.

use std::error::Error;

/// An error and its causes on one line, `a: b: c`. A cause whose text its error already
/// shows is left out: tonic's and hyper's errors often repeat their source.
pub fn error_chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let next = cause.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::fmt;

    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for Layer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|cause| cause as _)
        }
    }

    #[test]
    fn causes_follow_once_each() {
        let dial = Layer("connection refused", None);
        let transport = Layer("transport error: connection refused", Some(Box::new(dial)));
        let call = Layer("listing pools", Some(Box::new(transport)));
        assert_eq!(
            error_chain(&call),
            "listing pools: transport error: connection refused"
        );
        assert_eq!(error_chain(&Layer("alone", None)), "alone");
    }
}
