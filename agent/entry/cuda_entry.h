#pragma once

#include <string>

namespace tidemark::agent {

class Agent;

// `tidemark attach` in a process that uses CUDA (its driver, libcuda.so.1, is loaded): starts the
// CUPTI capture there, from now on (device memory reserved before the attach is not seen). Says
// what happened, for the attach status. Built with the CUPTI capture only (TIDEMARK_HAVE_CUPTI).
std::string startGpuCaptureOnAttach(Agent& agent);
// `tidemark detach`: stops it, what CUPTI holds recorded first.
void stopGpuCaptureOnDetach(int timeoutMs);

}  // namespace tidemark::agent
