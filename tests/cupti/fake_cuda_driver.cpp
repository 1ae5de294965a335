// Stands for the CUDA driver in the attach test: a library whose SONAME is libcuda.so.1, loaded by
// tidemark_fake_cuda_program's attach-target mode, so the process looks like one that uses CUDA to
// `tidemark attach` (which starts the GPU capture only there). It holds nothing else.
extern "C" __attribute__((visibility("default"))) int tidemark_fake_cuda_driver() { return 1; }
