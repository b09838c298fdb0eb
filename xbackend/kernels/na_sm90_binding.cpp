// Python binding for na_sm90.cu: one function over raw pointers, sizes and a stream, which
// na_sm90.py computes and checks (the kernel's input rules live there, beside its eligibility test).
// Plain CPython API and string literals only (see gated_residual_binding.cpp for why).

#include <Python.h>
#include <cuda_runtime.h>

const char *xb_na_shift_sm90(const void *q, const void *k, const void *v, void *out, const float *knorm, int *flags,
                             int B, int N0, int N1, int N2, int heads, int ks0, int ks1, int ks2, float qk_scale,
                             float shift_max, cudaStream_t stream);

namespace {

PyObject *shift(PyObject *, PyObject *args) {
  unsigned long long q, k, v, out, knorm, flags, stream;
  int B, N0, N1, N2, heads, ks0, ks1, ks2;
  double qk_scale, shift_max;
  if (!PyArg_ParseTuple(args, "KKKKKKiiiiiiiiddK", &q, &k, &v, &out, &knorm, &flags, &B, &N0, &N1, &N2, &heads, &ks0,
                        &ks1, &ks2, &qk_scale, &shift_max, &stream)) {
    return nullptr;
  }
  const char *err = xb_na_shift_sm90(reinterpret_cast<const void *>(q), reinterpret_cast<const void *>(k),
                                     reinterpret_cast<const void *>(v), reinterpret_cast<void *>(out),
                                     reinterpret_cast<const float *>(knorm), reinterpret_cast<int *>(flags), B, N0,
                                     N1, N2, heads, ks0, ks1, ks2, static_cast<float>(qk_scale),
                                     static_cast<float>(shift_max), reinterpret_cast<cudaStream_t>(stream));
  if (err != nullptr) {
    PyErr_SetString(PyExc_RuntimeError, err);
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"shift", shift, METH_VARARGS,
     "shift(q, k, v, out, knorm, flags, B, S0, S1, S2, heads, k0, k1, k2, qk_scale, shift_max, stream): "
     "neighborhood attention's shift launch (na_sm90.cu) on raw device pointers"},
    {nullptr, nullptr, 0, nullptr}};

#define XB_STR2(x) #x
#define XB_STR(x) XB_STR2(x)
#define XB_CAT2(a, b) a##b
#define XB_CAT(a, b) XB_CAT2(a, b)

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, XB_STR(TORCH_EXTENSION_NAME),
                          "xbackend neighborhood attention sm90a kernel (see na_sm90.py)", -1, methods};

}  // namespace

PyMODINIT_FUNC XB_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&module_def); }
