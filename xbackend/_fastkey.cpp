// The dispatch key of one op call, built in C++ (see xbackend/_fastkey.py for when it is used).
//
// KeyFn(name, tensor_mask, fallback) is a vectorcall callable. Called with an op's bound positional
// arguments it returns
//
//     (name, meta, a, tag(a), b, tag(b), ...)   for the arguments a, b, ... at non-tensor positions
//
// where `meta` is bytes holding, for each position whose bit is set in tensor_mask, in order:
// None -> one byte 0; a tensor -> a header (tag 1, dtype, device type, device index, log2 of the
// alignment class, ndim) then ndim sizes and ndim strides as int64. That is exactly what the Python
// keys (xbackend/_opspec.py `make_key`) read of a tensor: shape, stride(), dtype, device and the
// alignment class of data_ptr() (the largest power of two dividing it, at most kAlign; a null pointer
// is kAlign); the encoding is self-delimiting, so it is injective. tag(a) is type(a), or for an exact tuple the tuple of its elements' types: values compare
// with ==, and 1.0 == True, (1, 0) == (True, False), (3, 3) == (3.0, 3.0), while an op's check()
// accepts only one of each pair. The Python keys carry the same value and tag per non-tensor argument,
// so two calls get equal keys iff their Python keys are equal, and a cached key implies that check()
// passed for arguments of these very types.
//
// Whatever this code cannot read exactly as Python would is handed to `fallback` (the op's Python
// key) with the same arguments: a tensor subclass or a non-tensor at a tensor position (Python
// attribute access may run __torch_function__ or an override), an active torch function mode (it
// intercepts Python attribute access of plain tensors too), symbolic sizes, tensors without strides
// (sparse, nested), keyword arguments, too many dims, and a tensor the guard cannot copy (a vmap
// BatchedTensor, a functorch wrapper: their Python key holds None for the alignment class). Those calls get Python-form keys, which never
// equal a C++-form key (their second item is never bytes).
//
// Includes are kept to two headers: no torch/extension.h, no pybind11 module, so it builds fast.

#include <ATen/PythonTorchFunctionTLS.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <cstring>

namespace {

constexpr Py_ssize_t kMaxArgs = 64;  // positions a mask can name
constexpr size_t kBufBytes = 4096;   // larger metadata goes to the fallback
constexpr size_t kHeaderBytes = 9;   // tag, dtype, device type, device index, alignment (1 byte each), ndim (4)
constexpr uint64_t kAlign = 512;     // xbackend/_guard.py ALIGN
// The tensors xbackend/_guard.py `uncopyable` names (its _UNCOPYABLE): the Python key says so.
constexpr c10::DispatchKeySet kUncopyable({c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper,
                                           c10::DispatchKey::Functionalize, c10::DispatchKey::Python});

struct KeyFn {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* name;
  PyObject* fallback;
  uint64_t mask;
};

PyObject* fall_back(KeyFn* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

// Appends one tensor's record to buf at *pos; false when the fallback must take this call.
bool encode(const at::Tensor& t, char* buf, size_t* pos) {
  try {
    c10::SymIntArrayRef sizes = t.sym_sizes();  // what Tensor.shape reads
    c10::SymIntArrayRef strides = t.sym_strides();  // what Tensor.stride() reads
    const size_t ndim = sizes.size();
    if (strides.size() != ndim || *pos + kHeaderBytes + 16 * ndim > kBufBytes) {
      return false;
    }
    const int dtype = static_cast<int>(t.scalar_type());
    const c10::Device device = t.device();
    const int device_type = static_cast<int>(device.type());
    const int device_index = static_cast<int>(device.index());
    if (dtype < 0 || dtype > 255 || device_type < 0 || device_type > 255 || device_index < -128 ||
        device_index > 127 || t.key_set().has_any(kUncopyable)) {
      return false;
    }
    // data_ptr(), as Python's Tensor.data_ptr() reads it (it throws for a tensor without storage);
    // with kAlign's bit set, its lowest set bit is the class, found within log2(kAlign) steps.
    const uint64_t address = reinterpret_cast<uintptr_t>(t.data_ptr()) | kAlign;
    uint8_t align_log2 = 0;
    while (((address >> align_log2) & 1) == 0) {
      ++align_log2;
    }
    char* out = buf + *pos;
    out[0] = 1;
    out[1] = static_cast<char>(static_cast<uint8_t>(dtype));
    out[2] = static_cast<char>(static_cast<uint8_t>(device_type));
    out[3] = static_cast<char>(static_cast<int8_t>(device_index));
    out[4] = static_cast<char>(align_log2);
    const uint32_t n32 = static_cast<uint32_t>(ndim);
    std::memcpy(out + 5, &n32, 4);
    out += kHeaderBytes;
    for (size_t i = 0; i < ndim; ++i) {
      if (sizes[i].is_heap_allocated() || strides[i].is_heap_allocated()) {
        return false;  // symbolic: Python would return SymInts
      }
      const int64_t s = sizes[i].as_int_unchecked();
      const int64_t st = strides[i].as_int_unchecked();
      std::memcpy(out + 8 * i, &s, 8);
      std::memcpy(out + 8 * (ndim + i), &st, 8);
    }
    *pos += kHeaderBytes + 16 * ndim;
    return true;
  } catch (...) {  // e.g. "sparse tensors do not have strides": Python raises it, via the fallback
    return false;
  }
}

// A new reference to the type tag of one non-tensor argument (see the top of this file): a type
// object, or for an exact tuple a tuple of its elements' types. The Python keys build the same thing
// as `tuple(map(type, a)) if type(a) is tuple else type(a)`.
PyObject* type_tag(PyObject* a) {
  if (!PyTuple_CheckExact(a)) {
    PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(a));
    Py_INCREF(type);
    return type;
  }
  const Py_ssize_t size = PyTuple_GET_SIZE(a);
  PyObject* types = PyTuple_New(size);
  if (types == nullptr) {
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < size; ++i) {
    PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(PyTuple_GET_ITEM(a, i)));
    Py_INCREF(type);
    PyTuple_SET_ITEM(types, i, type);
  }
  return types;
}

PyObject* keyfn_vectorcall(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<KeyFn*>(callable);
  const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (kwnames != nullptr || n > kMaxArgs || at::impl::torch_function_mode_enabled()) {
    return fall_back(self, args, nargsf, kwnames);
  }
  char buf[kBufBytes];
  size_t pos = 0;
  Py_ssize_t others = 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* a = args[i];
    if (!((self->mask >> i) & 1)) {
      ++others;
    } else if (a == Py_None) {
      if (pos + 1 > kBufBytes) {
        return fall_back(self, args, nargsf, kwnames);
      }
      buf[pos++] = 0;
    } else if (!THPVariable_CheckExact(a) || !encode(THPVariable_Unpack(a), buf, &pos)) {
      return fall_back(self, args, nargsf, kwnames);
    }
  }
  PyObject* key = PyTuple_New(2 + 2 * others);
  if (key == nullptr) {
    return nullptr;
  }
  PyObject* meta = PyBytes_FromStringAndSize(buf, static_cast<Py_ssize_t>(pos));
  if (meta == nullptr) {
    Py_DECREF(key);
    return nullptr;
  }
  Py_INCREF(self->name);
  PyTuple_SET_ITEM(key, 0, self->name);
  PyTuple_SET_ITEM(key, 1, meta);
  Py_ssize_t j = 2;
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!((self->mask >> i) & 1)) {
      PyObject* tag = type_tag(args[i]);
      if (tag == nullptr) {
        Py_DECREF(key);  // the unset items are NULL, which tuple dealloc skips
        return nullptr;
      }
      Py_INCREF(args[i]);
      PyTuple_SET_ITEM(key, j++, args[i]);
      PyTuple_SET_ITEM(key, j++, tag);
    }
  }
  return key;
}

void keyfn_dealloc(PyObject* obj) {
  auto* self = reinterpret_cast<KeyFn*>(obj);
  Py_XDECREF(self->name);
  Py_XDECREF(self->fallback);
  Py_TYPE(obj)->tp_free(obj);
}

PyObject* keyfn_repr(PyObject* obj) {
  auto* self = reinterpret_cast<KeyFn*>(obj);
  return PyUnicode_FromFormat("<xbackend fast key of %R>", self->name);
}

PyTypeObject KeyFnType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// make(name: str, tensor_mask: int, fallback: callable) -> KeyFn
PyObject* make(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyUnicode_Check(args[0]) || !PyLong_Check(args[1]) || !PyCallable_Check(args[2])) {
    PyErr_SetString(PyExc_TypeError, "make(name: str, tensor_mask: int, fallback: callable)");
    return nullptr;
  }
  const unsigned long long mask = PyLong_AsUnsignedLongLong(args[1]);
  if (PyErr_Occurred()) {
    return nullptr;
  }
  auto* self = PyObject_New(KeyFn, &KeyFnType);
  if (self == nullptr) {
    return nullptr;
  }
  self->vectorcall = keyfn_vectorcall;
  Py_INCREF(args[0]);
  self->name = args[0];
  Py_INCREF(args[2]);
  self->fallback = args[2];
  self->mask = static_cast<uint64_t>(mask);
  return reinterpret_cast<PyObject*>(self);
}

PyMethodDef methods[] = {
    {"make", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(make)), METH_FASTCALL,
     "make(name, tensor_mask, fallback) -> a callable building the dispatch key of one op"},
    {nullptr, nullptr, 0, nullptr}};

#define XB_STR2(x) #x
#define XB_STR(x) XB_STR2(x)
#define XB_CAT2(a, b) a##b
#define XB_CAT(a, b) XB_CAT2(a, b)

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, XB_STR(TORCH_EXTENSION_NAME),
                          "xbackend dispatch keys in C++ (see xbackend/_fastkey.py)", -1, methods};

}  // namespace

PyMODINIT_FUNC XB_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  KeyFnType.tp_name = "xbackend_fastkey.KeyFn";
  KeyFnType.tp_basicsize = sizeof(KeyFn);
  KeyFnType.tp_dealloc = keyfn_dealloc;
  KeyFnType.tp_repr = keyfn_repr;
  KeyFnType.tp_vectorcall_offset = offsetof(KeyFn, vectorcall);
  KeyFnType.tp_call = PyVectorcall_Call;
  KeyFnType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  KeyFnType.tp_doc = "The dispatch key of one op; see make()";
  if (PyType_Ready(&KeyFnType) < 0) {
    return nullptr;
  }
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) {
    return nullptr;
  }
  if (PyModule_AddIntConstant(m, "FORMAT", 3) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
