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

std::string readPemFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in || text.str().empty()) {
    std::fprintf(stderr, "tidemark: cannot read %s\n", path.c_str());
    return "";
  }
  return text.str();
}

std::shared_ptr<grpc::Channel> makeChannel(const ChannelOptions& options) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options.tlsCa.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = readPemFile(options.tlsCa);
    if (!options.tlsCert.empty()) ssl.pem_cert_chain = readPemFile(options.tlsCert);
    if (!options.tlsKey.empty()) ssl.pem_private_key = readPemFile(options.tlsKey);
    credentials = grpc::SslCredentials(ssl);
  }
  if (options.token.empty()) return grpc::CreateChannel(options.target, credentials);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<TokenInterceptorFactory>(options.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      options.target, credentials, grpc::ChannelArguments(), std::move(factories));
}

}  // namespace tidemark::client
