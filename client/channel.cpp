#include "client/channel.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include <grpcpp/support/client_interceptor.h>

#include "src/base/daemon_address.h"

namespace tidemark::client {

namespace {

// Adds the token to the metadata every call sends first.
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(std::string header) : m_header(std::move(header)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", m_header});
    }
    methods->Proceed();
  }

 private:
  std::string m_header;
};

class TokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::string token) : m_header("Bearer " + std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(m_header);
  }

 private:
  std::string m_header;
};

}  // namespace

ChannelOptions ChannelOptions::fromEnvironment(std::string target) {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v != nullptr ? v : "");
  };
  ChannelOptions o;
  o.target = std::move(target);
  o.token = base::readToken(env("TIDEMARK_TOKEN"), env("TIDEMARK_TOKEN_FILE"));
  o.tlsCa = env("TIDEMARK_TLS_CA");
  o.tlsCert = env("TIDEMARK_TLS_CERT");
  o.tlsKey = env("TIDEMARK_TLS_KEY");
  return o;
}

namespace {
// The contents of a PEM file; false when it cannot be read or is empty.
bool readPemFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  *out = text.str();
  return static_cast<bool>(in) && !out->empty();
}
}  // namespace

std::shared_ptr<grpc::Channel> makeChannel(const ChannelOptions& options, std::string* error) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options.tlsCa.empty()) {
    // A file that cannot be read is an error, never an empty field: gRPC would take an empty CA
    // for "the system's roots" and trust any daemon with a public certificate.
    grpc::SslCredentialsOptions ssl;
    for (auto [path, field] : {std::pair{&options.tlsCa, &ssl.pem_root_certs},
                               std::pair{&options.tlsCert, &ssl.pem_cert_chain},
                               std::pair{&options.tlsKey, &ssl.pem_private_key}}) {
      if (!path->empty() && !readPemFile(*path, field)) {
        *error = "cannot read the PEM file " + *path;
        return nullptr;
      }
    }
    credentials = grpc::SslCredentials(ssl);
  }
  if (options.token.empty()) return grpc::CreateChannel(options.target, credentials);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<TokenInterceptorFactory>(options.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      options.target, credentials, grpc::ChannelArguments(), std::move(factories));
}

}  // namespace tidemark::client
