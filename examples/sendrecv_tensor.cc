// sendrecv_tensor: the smallest complete Loom program. Read it top to bottom.
//
// Run it with two ranks (docs/launchers.md shows srun, mpirun and two terminals by hand):
//
//     loomrun -n 2 ./build/examples/sendrecv_tensor
//
// A *rank* is one process of a distributed job; ranks are numbered 0, 1, 2, ... The *world size*
// is how many ranks the job has. Every rank runs this same program; they behave differently only
// because each one asks "which rank am I?" and branches on the answer.
#include <cstdio>
#include <vector>

#include "loom/loom.hpp"

int main() {
  try {
    // 1. Rendezvous. The launcher (loomrun, torchrun, srun, mpirun) has put this rank's number,
    //    the world size, and the address of rank 0 into environment variables. fromEnv() reads
    //    them, meets the other ranks at rank 0's address (rank 0 hosts a small key-value store
    //    there), exchanges everyone's network address, and opens a connection to every peer.
    //    It returns once every rank has arrived, or fails with a message naming who is missing.
    loom::Communicator comm = loom::Communicator::fromEnv();
    const int rank = comm.rank();
    const int worldSize = comm.size();

    if (worldSize < 2) {
      std::fprintf(stderr, "this example needs at least 2 ranks: loomrun -n 2 %s\n", "sendrecv_tensor");
      return 1;
    }

    // 2. A "tensor" here is simply 10 floats in a contiguous buffer.
    std::vector<float> tensor(10);

    // 3. Point-to-point: rank 0 sends, rank 1 receives. Both name the other side (the *peer*).
    //    send() returns once the data is on its way and the buffer may be reused; recv() returns
    //    once all 10 floats have arrived. Other ranks, if any, take no part.
    if (rank == 0) {
      tensor.assign(10, 1.0f);  // ten ones
      comm.send(tensor, /*peer=*/1);
      std::printf("rank 0 sent tensor [1, 1, 1, 1, 1, 1, 1, 1, 1, 1] to rank 1\n");
    } else if (rank == 1) {
      tensor.assign(10, 0.0f);  // start from zeros, so we can see the data arrive
      comm.recv(tensor, /*peer=*/0);
      std::printf("rank 1 received tensor [");
      for (size_t i = 0; i < tensor.size(); ++i) std::printf("%s%g", i == 0 ? "" : ", ", tensor[i]);
      std::printf("] from rank 0\n");
    }

    // 4. A barrier: nobody continues until every rank has reached this line. Without it, a rank
    //    with nothing to do could exit while the others are still working.
    comm.barrier();
    return 0;
    // 5. `comm` goes out of scope here: its connections are closed cleanly.
  } catch (const loom::Error& e) {
    // Every failure (a missing rank, a timeout, a bad argument) arrives as one exception type
    // with a message that says what went wrong and with whom.
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
