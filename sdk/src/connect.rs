//! The WebSocket of a connect subresource (exec, portforward, a process's attach), with
//! a refusal before the upgrade mapped to the SDK's errors.

use crate::client::Client;
use crate::error::Error;

impl Client {
    /// Opens the WebSocket of the connect subresource `subresource` (`exec`,
    /// `portforward`) of the claim `claim`, asking with `query`. A refusal before the
    /// upgrade is the server's Status, mapped as for any call on a claim of `pool`.
    pub(crate) async fn connect(
        &self,
        claim: &str,
        subresource: &str,
        query: &str,
        pool: &str,
    ) -> Result<kube::client::Connection, Error> {
        let url = format!(
            "{}/{claim}/{subresource}?{query}",
            self.claims().resource_url()
        );
        self.connect_url(url, pool).await
    }

    /// Opens the WebSocket at `url`; a refusal maps as [`Client::connect`]'s.
    pub(crate) async fn connect_url(
        &self,
        url: String,
        pool: &str,
    ) -> Result<kube::client::Connection, Error> {
        let request = http::Request::get(url)
            .body(Vec::new())
            .map_err(|e| Error::Api(kube::Error::HttpError(e)))?;
        self.kube()
            .connect(request)
            .await
            .map_err(|e| Error::from_claims(e, pool))
    }
}
