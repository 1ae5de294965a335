#include "client/channel.h"

#include <utility>
#include <vector>

#include <grpcpp/support/client_interceptor.h>

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

std::shared_ptr<grpc::Channel> makeChannel(const ChannelOptions& options) {
  const std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options.token.empty()) return grpc::CreateChannel(options.target, credentials);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<TokenInterceptorFactory>(options.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      options.target, credentials, grpc::ChannelArguments(), std::move(factories));
}

}  // namespace tidemark::client
